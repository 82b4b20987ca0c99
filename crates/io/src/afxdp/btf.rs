//! Finding a kernel function's BTF type id, for a kfunc call
//! (`BPF_PSEUDO_KFUNC_CALL` names its callee by that id in the kernel's
//! own BTF, `/sys/kernel/btf/vmlinux`).
//!
//! BTF (`Documentation/bpf/btf.rst`): a header, a type section and a string
//! section. Types are numbered from 1 in the order they appear; each is a
//! 12-byte `struct btf_type` (name offset, info, size or type) followed by
//! kind-specific data whose length the kind and `vlen` give. Only what the
//! walk needs is decoded: every kind's length, and the name of a `FUNC`.

/// `BTF_MAGIC`.
const MAGIC: u16 = 0xeb9f;
/// `BTF_KIND_FUNC`.
const KIND_FUNC: u32 = 12;

/// The kernel's BTF.
const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

/// The BTF type id of the kernel function `name` (a `FUNC` in the
/// kernel's BTF), or `None` when the kernel has no BTF or no such function.
pub(crate) fn vmlinux_func(name: &str) -> Option<u32> {
    let blob = std::fs::read(VMLINUX).ok()?;
    func_id(&blob, name)
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Bytes that follow the 12-byte `struct btf_type` of a type of `kind`
/// with `vlen` members; `None` for a kind this walk does not know (a newer
/// kernel's), which ends the search rather than misreading the rest.
fn extra_len(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT: one u32 of encoding.
        1 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT,
        // TYPE_TAG: nothing.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // ARRAY: struct btf_array.
        3 => 12,
        // STRUCT, UNION: btf_member each; DATASEC: btf_var_secinfo each;
        // ENUM64: btf_enum64 each.
        4 | 5 | 15 | 19 => 12 * vlen,
        // ENUM: btf_enum each; FUNC_PROTO: btf_param each.
        6 | 13 => 8 * vlen,
        // VAR: btf_var; DECL_TAG: btf_decl_tag.
        14 | 17 => 4,
        _ => return None,
    })
}

/// The id of the `FUNC` named `name` in the BTF blob `b` (little-endian,
/// as the kernel exports it on x86 and arm64).
pub(crate) fn func_id(b: &[u8], name: &str) -> Option<u32> {
    if u16_at(b, 0)? != MAGIC {
        return None;
    }
    let hdr_len = u32_at(b, 4)? as usize;
    let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
    let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
    let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strs = b.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    let name_at = |off: usize| -> Option<&[u8]> {
        let s = strs.get(off..)?;
        s.get(..s.iter().position(|&c| c == 0)?)
    };
    let (mut at, mut id) = (0usize, 1u32);
    while at + 12 <= types.len() {
        let name_off = u32_at(types, at)? as usize;
        let info = u32_at(types, at + 4)?;
        let kind = (info >> 24) & 0x1f;
        let vlen = (info & 0xffff) as usize;
        if kind == KIND_FUNC && name_at(name_off) == Some(name.as_bytes()) {
            return Some(id);
        }
        at += 12 + extra_len(kind, vlen)?;
        id += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of `types` (kind, vlen, name) whose names are laid out
    /// in a string section after the empty name.
    fn blob(types: &[(u32, u16, &str)]) -> Vec<u8> {
        let mut strs = vec![0u8];
        let mut ts = Vec::new();
        for (kind, vlen, name) in types {
            let off = if name.is_empty() {
                0
            } else {
                let o = strs.len() as u32;
                strs.extend_from_slice(name.as_bytes());
                strs.push(0);
                o
            };
            ts.extend_from_slice(&off.to_le_bytes());
            ts.extend_from_slice(&((kind << 24) | u32::from(*vlen)).to_le_bytes());
            ts.extend_from_slice(&0u32.to_le_bytes());
            ts.resize(
                ts.len() + extra_len(*kind, usize::from(*vlen)).unwrap(),
                0xaa,
            );
        }
        let mut b = Vec::new();
        b.extend_from_slice(&MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        for v in [
            24u32,
            0,
            ts.len() as u32,
            ts.len() as u32,
            strs.len() as u32,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&ts);
        b.extend_from_slice(&strs);
        b
    }

    #[test]
    fn finds_a_func_after_types_of_every_length() {
        let b = blob(&[
            (1, 0, "int"),
            (4, 3, "xdp_md"),
            (13, 3, ""),
            (6, 5, "e"),
            (3, 0, ""),
            (15, 2, ".data"),
            (12, 0, "bpf_xdp_metadata_rx_hash"),
            (12, 0, "bpf_xdp_metadata_rx_vlan_tag"),
        ]);
        assert_eq!(func_id(&b, "bpf_xdp_metadata_rx_vlan_tag"), Some(8));
        assert_eq!(func_id(&b, "bpf_xdp_metadata_rx_hash"), Some(7));
        // A struct of that name is not a function.
        assert_eq!(func_id(&b, "xdp_md"), None);
        assert_eq!(func_id(&b, "missing"), None);
    }

    #[test]
    fn bad_blobs_give_nothing() {
        let b = blob(&[(12, 0, "f")]);
        assert_eq!(func_id(&b, "f"), Some(1));
        let mut wrong = b.clone();
        wrong[0] = 0;
        assert_eq!(func_id(&wrong, "f"), None, "bad magic");
        for n in 0..b.len() {
            // Truncated anywhere: never a panic, never a wrong id.
            assert!(matches!(func_id(&b[..n], "f"), None | Some(1)));
        }
        // An unknown kind ahead of the function ends the walk.
        let b = blob(&[(1, 0, "int"), (12, 0, "f")]);
        let mut unknown = b.clone();
        unknown[24 + 7] = 31;
        assert_eq!(func_id(&unknown, "f"), None);
    }
}
