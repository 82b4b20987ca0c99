//! The XDP program that feeds AF_XDP sockets, and its loading with raw
//! `bpf(2)` calls (no libbpf, no clang at build time).
//!
//! The program, hand-assembled (eBPF ISA, `struct bpf_insn`):
//!
//! ```text
//! r2 = *(u32 *)(r1 + 16)        ; ctx->rx_queue_index
//! r1 = map_fd ll                ; the XSKMAP (BPF_PSEUDO_MAP_FD)
//! r3 = 2                        ; XDP_PASS: action if no socket for this queue
//! call bpf_redirect_map         ; helper 51
//! exit                          ; r0 = XDP_REDIRECT or XDP_PASS
//! ```
//!
//! Since Linux 5.3 the low bits of `bpf_redirect_map`'s flags are the action
//! returned when the map has no entry, so no explicit lookup is needed.
//! It is attached with `BPF_LINK_CREATE` (attach type `BPF_XDP`): closing
//! the link descriptor detaches it, so a crash cannot leave it behind.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::error::IoError;
use crate::sys;

const BPF_MAP_CREATE: i32 = 0;
const BPF_MAP_UPDATE_ELEM: i32 = 2;
const BPF_PROG_LOAD: i32 = 5;
const BPF_LINK_CREATE: i32 = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;

/// `struct bpf_insn`: opcode, dst (low nibble) / src (high nibble), offset, immediate.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BpfInsn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> BpfInsn {
    BpfInsn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// Index of the `ld_imm64` whose immediate is patched with the map fd.
const MAP_FD_INSN: usize = 1;

/// The program; `imm` of insn [`MAP_FD_INSN`] is replaced by the map fd.
pub(crate) const XSK_REDIRECT_PROG: [BpfInsn; 6] = [
    // BPF_LDX | BPF_MEM | BPF_W: r2 = *(u32 *)(r1 + 16)
    insn(0x61, 2, 1, 16, 0),
    // BPF_LD | BPF_DW | BPF_IMM, src = BPF_PSEUDO_MAP_FD: r1 = map
    insn(0x18, 1, 1, 0, 0),
    insn(0x00, 0, 0, 0, 0),
    // BPF_ALU64 | BPF_MOV | BPF_K: r3 = XDP_PASS
    insn(0xb7, 3, 0, 0, 2),
    // BPF_JMP | BPF_CALL: bpf_redirect_map
    insn(0x85, 0, 0, 0, 51),
    // BPF_JMP | BPF_EXIT
    insn(0x95, 0, 0, 0, 0),
];

/// How the XDP program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpMode {
    /// Native (driver) mode, else generic (SKB) mode.
    Auto,
    /// Native mode only.
    Native,
    /// Generic (SKB) mode only.
    Generic,
}

fn bpf<A>(cmd: i32, attr: &mut A, call: &'static str) -> Result<OwnedFd, IoError> {
    let r = bpf_raw(cmd, attr, call)?;
    // SAFETY: these commands return a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r) })
}

fn bpf_raw<A>(cmd: i32, attr: &mut A, call: &'static str) -> Result<i32, IoError> {
    // SAFETY: `attr` is a live, fully initialised `repr(C)` bpf_attr prefix
    // for `cmd`, and we pass its exact size; the kernel zero-extends it and
    // may write back into it (within that size).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut A).cast::<libc::c_void>(),
            core::mem::size_of::<A>() as u32,
        )
    };
    if r < 0 {
        return Err(IoError::last(call));
    }
    Ok(r as i32)
}

#[repr(C)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
struct MapUpdateAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_ifindex: u32,
    attach_type: u32,
    flags: u32,
}

/// A loaded and attached program with its XSKMAP. Dropping it detaches the
/// program (the link closes first, then the program and map).
#[derive(Debug)]
pub(crate) struct XdpAttachment {
    link: OwnedFd,
    _prog: OwnedFd,
    map: OwnedFd,
    native: bool,
}

impl XdpAttachment {
    /// Create the map, load the program and attach it to `ifindex`.
    pub(crate) fn attach(ifindex: u32, mode: XdpMode, queues: u32) -> Result<Self, IoError> {
        let mut m = MapCreateAttr {
            map_type: BPF_MAP_TYPE_XSKMAP,
            key_size: 4,
            value_size: 4,
            max_entries: queues.max(1),
            map_flags: 0,
        };
        let map = bpf(BPF_MAP_CREATE, &mut m, "bpf(BPF_MAP_CREATE XSKMAP)")?;
        let mut prog_insns = XSK_REDIRECT_PROG;
        prog_insns[MAP_FD_INSN].imm = sys::raw(&map);
        let license = b"Dual MIT/GPL\0";
        let mut name = [0u8; 16];
        name[..10].copy_from_slice(b"sluice_xsk");
        let mut p = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_XDP,
            insn_cnt: prog_insns.len() as u32,
            insns: prog_insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 0,
            log_size: 0,
            log_buf: 0,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name,
            prog_ifindex: 0,
            expected_attach_type: BPF_XDP,
        };
        let prog = bpf(BPF_PROG_LOAD, &mut p, "bpf(BPF_PROG_LOAD xdp)")?;
        let try_mode = |flags: u32, call: &'static str| {
            let mut l = LinkCreateAttr {
                prog_fd: sys::raw(&prog) as u32,
                target_ifindex: ifindex,
                attach_type: BPF_XDP,
                flags,
            };
            bpf(BPF_LINK_CREATE, &mut l, call)
        };
        let (link, native) = match mode {
            XdpMode::Native => (
                try_mode(XDP_FLAGS_DRV_MODE, "bpf(BPF_LINK_CREATE xdp native)")?,
                true,
            ),
            XdpMode::Generic => (
                try_mode(XDP_FLAGS_SKB_MODE, "bpf(BPF_LINK_CREATE xdp generic)")?,
                false,
            ),
            XdpMode::Auto => {
                match try_mode(XDP_FLAGS_DRV_MODE, "bpf(BPF_LINK_CREATE xdp native)") {
                    Ok(l) => (l, true),
                    Err(e) => {
                        tracing::info!("native XDP attach failed ({e}); trying generic (SKB) mode");
                        (
                            try_mode(XDP_FLAGS_SKB_MODE, "bpf(BPF_LINK_CREATE xdp generic)")?,
                            false,
                        )
                    }
                }
            }
        };
        Ok(Self {
            link,
            _prog: prog,
            map,
            native,
        })
    }

    /// Point queue `queue` at socket `xsk_fd`.
    pub(crate) fn set_socket(&self, queue: u32, xsk_fd: i32) -> Result<(), IoError> {
        let key = queue;
        let value = xsk_fd as u32;
        let mut a = MapUpdateAttr {
            map_fd: sys::raw(&self.map) as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u32 as u64,
            flags: 0,
        };
        bpf_raw(
            BPF_MAP_UPDATE_ELEM,
            &mut a,
            "bpf(BPF_MAP_UPDATE_ELEM xskmap)",
        )
        .map(|_| ())
    }

    pub(crate) fn native(&self) -> bool {
        self.native
    }

    pub(crate) fn link_fd(&self) -> i32 {
        sys::raw(&self.link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_encoding_matches_the_isa() {
        // Byte images as `llvm-objdump -d` prints them for the same program.
        let bytes: Vec<[u8; 8]> = XSK_REDIRECT_PROG
            .iter()
            .map(|i| {
                let mut b = [0u8; 8];
                b[0] = i.code;
                b[1] = i.regs;
                b[2..4].copy_from_slice(&i.off.to_le_bytes());
                b[4..8].copy_from_slice(&i.imm.to_le_bytes());
                b
            })
            .collect();
        assert_eq!(bytes[0], [0x61, 0x12, 0x10, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[1], [0x18, 0x11, 0, 0, 0, 0, 0, 0]);
        assert_eq!(bytes[2], [0; 8]);
        assert_eq!(bytes[3], [0xb7, 0x03, 0, 0, 2, 0, 0, 0]);
        assert_eq!(bytes[4], [0x85, 0, 0, 0, 51, 0, 0, 0]);
        assert_eq!(bytes[5], [0x95, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(core::mem::size_of::<BpfInsn>(), 8);
    }
}
