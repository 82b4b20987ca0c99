//! The state of an interface's link, as the gateway watches it.

use crate::error::IfName;

/// What [`state`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Administratively up and running (`IFF_UP` and `IFF_RUNNING`: the
    /// carrier is there, `operstate` up).
    Up,
    /// Present but down: set down, or no carrier.
    Down,
    /// No interface of that name in this network namespace (deleted, or
    /// moved to another namespace).
    Gone,
}

impl LinkState {
    /// The name operators see (`sluice ctl status`, logs).
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Up => "up",
            LinkState::Down => "down",
            LinkState::Gone => "gone",
        }
    }
}

/// The link state of interface `name` in the calling thread's network
/// namespace (`SIOCGIFFLAGS`); `Err` only when the query itself fails
/// (no socket could be opened).
pub fn state(name: &IfName) -> Result<LinkState, crate::IoError> {
    match crate::sys::if_flags(name)? {
        None => Ok(LinkState::Gone),
        Some(f) => {
            let want = (libc::IFF_UP | libc::IFF_RUNNING) as u32;
            Ok(if f & want == want {
                LinkState::Up
            } else {
                LinkState::Down
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_up_and_a_missing_interface_gone() {
        let lo = IfName::new("lo").unwrap();
        assert_eq!(state(&lo).unwrap(), LinkState::Up);
        let none = IfName::new("sluice-nx0").unwrap();
        assert_eq!(state(&none).unwrap(), LinkState::Gone);
    }
}
