//! Keep the kernel's stack off the frames Sluice owns.
//!
//! An AF_PACKET socket receives a *copy* of each frame; the kernel stack
//! still processes the original (answers ARP, routes, sends RSTs). For an
//! interface Sluice owns, that must not happen. [`IngressDrop`] installs, via
//! the `nft` program, a netdev-family table with one ingress chain per owned
//! interface and policy drop:
//!
//! ```text
//! table netdev sluice {
//!     chain in_veth0 { type filter hook ingress device "veth0" priority -500; policy drop; }
//! }
//! ```
//!
//! In `__netif_receive_skb_core` the packet taps (`ptype_all`, which is where
//! AF_PACKET sockets hang) run before the ingress hook, so AF_PACKET still
//! receives every frame while the stack receives none (verified by the root
//! test `afpacket_receives_while_nft_ingress_drops`). AF_XDP does not need it:
//! its XDP program redirects frames before any skb exists. Frames Sluice
//! transmits do not pass ingress of the same interface and are unaffected.
//!
//! The table is deleted on drop. The commands run in the calling thread's
//! network namespace.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::error::{IfName, IoError};

/// Name of the nftables table the guard owns.
pub const TABLE: &str = "sluice";

/// An installed netdev ingress drop; removed on drop.
#[derive(Debug)]
pub struct IngressDrop {
    ifnames: Vec<IfName>,
    removed: bool,
}

/// The nft script [`IngressDrop::install`] loads.
pub fn ingress_drop_script(ifnames: &[IfName]) -> String {
    let mut s = format!("table netdev {TABLE} {{\n");
    for n in ifnames {
        let chain: String = n
            .as_str()
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        s.push_str(&format!(
            "    chain in_{chain} {{ type filter hook ingress device \"{n}\" priority -500; policy drop; }}\n"
        ));
    }
    s.push_str("}\n");
    s
}

fn run_nft(args: &[&str], stdin: Option<&str>) -> Result<(), IoError> {
    let mut cmd = Command::new("nft");
    cmd.args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = cmd.spawn().map_err(|_| IoError::Subprocess {
        program: "nft",
        status: None,
    })?;
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes())
            .map_err(|_| IoError::Subprocess {
                program: "nft",
                status: None,
            })?;
    }
    let st = child.wait().map_err(|_| IoError::Subprocess {
        program: "nft",
        status: None,
    })?;
    if !st.success() {
        return Err(IoError::Subprocess {
            program: "nft",
            status: st.code(),
        });
    }
    Ok(())
}

impl IngressDrop {
    /// Install the drop for `ifnames` (an existing `netdev sluice` table is
    /// extended). Needs CAP_NET_ADMIN and the `nft` binary.
    pub fn install(ifnames: &[&str]) -> Result<Self, IoError> {
        let names = ifnames
            .iter()
            .map(|n| IfName::new(n))
            .collect::<Result<Vec<_>, _>>()?;
        run_nft(&["-f", "-"], Some(&ingress_drop_script(&names)))?;
        Ok(Self {
            ifnames: names,
            removed: false,
        })
    }

    /// The interfaces covered.
    /// Hook the drop chain of `ifname` (one of [`IngressDrop::interfaces`])
    /// to the interface of that name as it is now: one that was deleted and
    /// made again. Kernels from 6.16 bind a netdev chain to a new device of
    /// its name themselves; older ones deleted the chain with the device.
    /// Declaring it again is harmless either way.
    pub fn rehook(&self, ifname: &str) -> Result<(), IoError> {
        let n = IfName::new(ifname)?;
        if !self.ifnames.contains(&n) {
            return Err(IoError::Unsupported {
                backend: crate::BackendKind::AfPacket,
                why: "the ingress drop does not cover that interface",
            });
        }
        run_nft(&["-f", "-"], Some(&ingress_drop_script(&[n])))
    }

    pub fn interfaces(&self) -> &[IfName] {
        &self.ifnames
    }

    /// Delete the table now (also done on drop), reporting failure.
    pub fn remove(mut self) -> Result<(), IoError> {
        self.removed = true;
        run_nft(&["delete", "table", "netdev", TABLE], None)
    }
}

impl Drop for IngressDrop {
    fn drop(&mut self) {
        if !self.removed {
            let _ = run_nft(&["delete", "table", "netdev", TABLE], None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_has_one_chain_per_interface() {
        let n = [
            IfName::new("veth0").unwrap(),
            IfName::new("eth1.100").unwrap(),
        ];
        let s = ingress_drop_script(&n);
        assert_eq!(
            s,
            "table netdev sluice {\n    chain in_veth0 { type filter hook ingress device \"veth0\" priority -500; policy drop; }\n    chain in_eth1_100 { type filter hook ingress device \"eth1.100\" priority -500; policy drop; }\n}\n"
        );
    }
}
