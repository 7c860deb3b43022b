//! The two derivations both ends of a tunnel compute from a node name: the kubelet port
//! and the node's loopback address on the control-plane host.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

/// FNV-1a offset basis for 32-bit hashes.
const FNV_OFFSET_BASIS: u32 = 0x811c_9dc5;
/// FNV-1a prime for 32-bit hashes.
const FNV_PRIME: u32 = 0x0100_0193;

/// 32-bit FNV-1a over `bytes`: for each byte, `h = (h XOR byte) * 16777619 mod 2^32`,
/// starting from `h = 2166136261`.
///
/// Chosen because it is a published, unkeyed, four-line algorithm that a shell script on a
/// worker can reproduce bit for bit; nothing here needs a cryptographic hash.
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(FNV_PRIME)
    })
}

/// A contiguous range of ports, `base ..= base + slots - 1`, into which node names hash.
///
/// The default, 20000-29999, sits below the NodePort range (30000-32767) and the Linux
/// ephemeral range (32768-60999), and above the Kubernetes component ports (the kubelet's
/// 10248/10250/10255, kube-proxy's 10249/10256, the controller manager's 10257, the
/// scheduler's 10259), etcd (2379/2380), the API server (6443) and k3s' supervisor (9345).
/// A tunnel server listening across it therefore cannot steal a port the kernel hands out
/// for outgoing connections or one a Service claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    base: u16,
    slots: u16,
}

/// Why a [`PortRange`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    /// The range has no slots.
    #[error("port range must have at least one slot (got base {base}, slots 0)")]
    Empty {
        /// The requested first port.
        base: u16,
    },
    /// Port 0 is not a port anyone can listen on by number.
    #[error("port range cannot start at port 0: choose a base of 1024 or more")]
    ZeroBase,
    /// The last port would exceed 65535.
    #[error("port range {base}+{slots} runs past port 65535: lower the base or the slot count")]
    Overflow {
        /// The requested first port.
        base: u16,
        /// The requested number of slots.
        slots: u16,
    },
}

impl PortRange {
    /// The default range: 10,000 slots from port 20000 (20000-29999).
    pub const DEFAULT: PortRange = PortRange {
        base: 20000,
        slots: 10000,
    };

    /// A range of `slots` ports starting at `base`.
    pub fn new(base: u16, slots: u16) -> Result<PortRange, PortRangeError> {
        if slots == 0 {
            return Err(PortRangeError::Empty { base });
        }
        if base == 0 {
            return Err(PortRangeError::ZeroBase);
        }
        if u32::from(base) + u32::from(slots) - 1 > u32::from(u16::MAX) {
            return Err(PortRangeError::Overflow { base, slots });
        }
        Ok(PortRange { base, slots })
    }

    /// The first port of the range.
    pub fn base(&self) -> u16 {
        self.base
    }

    /// How many ports the range holds.
    pub fn slots(&self) -> u16 {
        self.slots
    }

    /// The last port of the range.
    pub fn last(&self) -> u16 {
        self.base + (self.slots - 1)
    }

    /// Whether `port` lies inside the range.
    pub fn contains(&self, port: u16) -> bool {
        (self.base..=self.last()).contains(&port)
    }

    /// `base + fnv1a32(utf8(name)) mod slots`.
    pub fn port_for(&self, name: &str) -> u16 {
        // The remainder is below `slots`, which fits u16, and `new` checked the sum.
        let offset = (fnv1a32(name.as_bytes()) % u32::from(self.slots)) as u16;
        self.base + offset
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange::DEFAULT
    }
}

/// The port on which a node's kubelet is published through its tunnel, derived from the
/// node's routing name over the default [`PortRange`] (20000-29999).
///
/// Derived rather than allocated: the worker (which binds the tunnel's remote port) and the
/// control plane (which patches the Node) compute it independently, so no registry or
/// handshake can make them disagree. Two names landing on one slot is possible; the
/// reconciler's diagnostics flag such pairs.
pub fn kubelet_port_for_node(name: &str) -> u16 {
    PortRange::DEFAULT.port_for(name)
}

/// Reports the port on which this control-plane host reaches a node's kubelet (the local
/// end of the node's tunnel), or `None` to skip the node for now (its tunnel is not up).
pub type KubeletPortFunc = Arc<dyn Fn(&str) -> Option<u16> + Send + Sync>;

/// The default [`KubeletPortFunc`]: [`kubelet_port_for_node`], known for every name.
pub fn derived_kubelet_port(name: &str) -> Option<u16> {
    Some(kubelet_port_for_node(name))
}

/// A [`KubeletPortFunc`] deriving ports over `range`.
pub fn port_func(range: PortRange) -> KubeletPortFunc {
    Arc::new(move |name: &str| Some(range.port_for(name)))
}

/// Addresses `loopback_for_node` may return: 127.0.0.2 ..= 127.255.255.254.
const LOOPBACK_FIRST: u32 = 0x7f00_0002;
const LOOPBACK_CANDIDATES: u32 = (1 << 24) - 3;

/// The first address [`loopback_for_node`] tries for `name` before probing:
/// `127.0.0.2 + fnv1a32(utf8(name)) mod 16777213`.
pub fn loopback_candidate(name: &str) -> Ipv4Addr {
    nth_candidate(fnv1a32(name.as_bytes()) % LOOPBACK_CANDIDATES)
}

fn nth_candidate(index: u32) -> Ipv4Addr {
    Ipv4Addr::from(LOOPBACK_FIRST + index)
}

/// A node-unique address in 127.0.0.0/8 for `name`, never 127.0.0.0, 127.0.0.1 or
/// 127.255.255.255.
///
/// `taken` maps addresses already handed out to the name holding them. Starting at
/// [`loopback_candidate`], the function steps to the next address (wrapping from
/// 127.255.255.254 to 127.0.0.2) while the address is held by another name; an address
/// already held by `name` itself is returned as is. Callers assign names in sorted order so
/// that a given set of nodes always maps the same way: an order that varied between passes
/// would move addresses around and every pass would rewrite Nodes.
///
/// Why unique and not simply 127.0.0.1: k3s' tunnel server indexes nodes by their
/// addresses, last writer winning for equal addresses, so nodes sharing one ExternalIP
/// collapse into one entry and every kubelet dial lands on an arbitrary one of them.
///
/// # Panics
///
/// Never for fewer than 16,777,213 taken addresses; with every candidate held by another
/// name there is no answer and it panics rather than loop forever.
pub fn loopback_for_node(name: &str, taken: &BTreeMap<Ipv4Addr, String>) -> Ipv4Addr {
    loopback_held_by(name, name, taken)
}

/// [`loopback_for_node`] hashing `name` but probing for `holder`: the reconciler probes
/// from a node's routing name (what a worker can compute) while holding the address under
/// the node's unique registered name, so that two nodes sharing a routing name still get
/// two addresses.
pub(crate) fn loopback_held_by(
    name: &str,
    holder: &str,
    taken: &BTreeMap<Ipv4Addr, String>,
) -> Ipv4Addr {
    probe_from(
        fnv1a32(name.as_bytes()) % LOOPBACK_CANDIDATES,
        holder,
        taken,
    )
}

fn probe_from(start: u32, name: &str, taken: &BTreeMap<Ipv4Addr, String>) -> Ipv4Addr {
    let mut index = start;
    loop {
        let addr = nth_candidate(index);
        match taken.get(&addr) {
            None => return addr,
            Some(holder) if holder == name => return addr,
            Some(_) => {}
        }
        index = (index + 1) % LOOPBACK_CANDIDATES;
        assert!(
            index != start,
            "every address in 127.0.0.0/8 is taken; cannot place node {name}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Published FNV-1a 32 test vectors (Fowler/Noll/Vo reference test suite).
    #[test]
    fn fnv1a32_matches_reference_vectors() {
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    // Pinned: these numbers are a wire contract with workers and with the shell snippet in
    // docs/nodeaddr.md. A change here breaks every deployed tunnel.
    #[test]
    fn kubelet_ports_are_pinned() {
        let vectors = [
            ("", 20000 + 0x811c_9dc5_u32 % 10000),
            ("a", 20000 + 0xe40c_292c_u32 % 10000),
            ("foobar", 20000 + 0xbf9c_f968_u32 % 10000),
        ];
        for (name, port) in vectors {
            assert_eq!(u32::from(kubelet_port_for_node(name)), port, "{name:?}");
        }
        assert_eq!(kubelet_port_for_node(""), 26261);
        assert_eq!(kubelet_port_for_node("a"), 22220);
        assert_eq!(kubelet_port_for_node("foobar"), 25720);
        assert_eq!(kubelet_port_for_node("worker-1"), PINNED_WORKER_1);
        assert_eq!(kubelet_port_for_node("gpu-box"), PINNED_GPU_BOX);
        assert_eq!(kubelet_port_for_node("node-α"), PINNED_NODE_ALPHA);
    }

    const PINNED_WORKER_1: u16 = 21149;
    const PINNED_GPU_BOX: u16 = 27569;
    // Non-ASCII names hash their UTF-8 bytes.
    const PINNED_NODE_ALPHA: u16 = 26609;

    #[test]
    fn loopbacks_are_pinned() {
        let none = BTreeMap::new();
        assert_eq!(loopback_candidate("a"), Ipv4Addr::new(127, 12, 43, 218));
        assert_eq!(
            loopback_for_node("a", &none),
            Ipv4Addr::new(127, 12, 43, 218)
        );
        assert_eq!(loopback_candidate(""), Ipv4Addr::new(127, 28, 159, 74));
        assert_eq!(
            loopback_for_node("worker-1", &none),
            PINNED_WORKER_1_LOOPBACK
        );
    }

    const PINNED_WORKER_1_LOOPBACK: Ipv4Addr = Ipv4Addr::new(127, 249, 51, 136);

    #[test]
    fn default_range_avoids_nodeports_ephemeral_and_component_ports() {
        let r = PortRange::DEFAULT;
        assert_eq!((r.base(), r.last(), r.slots()), (20000, 29999, 10000));
        for reserved in [
            2379, 2380, 6443, 9345, 10248, 10249, 10250, 10255, 10256, 10257, 10259,
        ] {
            assert!(!r.contains(reserved), "{reserved}");
        }
        assert!(r.last() < 30000, "NodePort range starts at 30000");
        assert!(r.last() < 32768, "ephemeral range starts at 32768");
    }

    #[test]
    fn custom_ranges_are_checked() {
        assert_eq!(
            PortRange::new(40000, 0),
            Err(PortRangeError::Empty { base: 40000 })
        );
        assert_eq!(PortRange::new(0, 10), Err(PortRangeError::ZeroBase));
        assert_eq!(
            PortRange::new(65000, 1000),
            Err(PortRangeError::Overflow {
                base: 65000,
                slots: 1000
            })
        );
        let top = PortRange::new(65535, 1).unwrap();
        assert_eq!(top.port_for("anything"), 65535);
        let small = PortRange::new(40000, 7).unwrap();
        for name in ["a", "b", "worker-1", "gpu-box", ""] {
            assert!(small.contains(small.port_for(name)));
        }
        assert_eq!(
            small.port_for("a"),
            40000 + (0xe40c_292c_u32 % 7) as u16,
            "same hash, other modulus"
        );
    }

    #[test]
    fn port_func_follows_its_range() {
        let f = port_func(PortRange::new(40000, 100).unwrap());
        assert_eq!(f("a"), Some(40000 + (0xe40c_292c_u32 % 100) as u16));
        assert_eq!(derived_kubelet_port("a"), Some(22220));
    }

    #[test]
    fn probing_skips_addresses_held_by_others_and_keeps_own() {
        let first = loopback_candidate("a");
        let mut taken = BTreeMap::new();
        taken.insert(first, "b".to_string());
        let second = loopback_for_node("a", &taken);
        assert_eq!(u32::from(second), u32::from(first) + 1);
        taken.insert(second, "c".to_string());
        assert_eq!(
            u32::from(loopback_for_node("a", &taken)),
            u32::from(first) + 2
        );
        // An address already held by the same name is that name's answer.
        let mut own = BTreeMap::new();
        own.insert(first, "a".to_string());
        assert_eq!(loopback_for_node("a", &own), first);
    }

    #[test]
    fn probing_wraps_past_the_top_and_never_returns_reserved_addresses() {
        let top_index = LOOPBACK_CANDIDATES - 1;
        assert_eq!(nth_candidate(top_index), Ipv4Addr::new(127, 255, 255, 254));
        let mut taken = BTreeMap::new();
        taken.insert(nth_candidate(top_index), "x".to_string());
        // Starting at the top address, held by another name, the probe wraps to the bottom
        // of the block: 127.0.0.2, skipping .0.0.0, .0.0.1 and the broadcast address.
        assert_eq!(
            probe_from(top_index, "a", &taken),
            Ipv4Addr::new(127, 0, 0, 2)
        );
        taken.insert(Ipv4Addr::new(127, 0, 0, 2), "y".to_string());
        assert_eq!(
            probe_from(top_index, "a", &taken),
            Ipv4Addr::new(127, 0, 0, 3)
        );
    }

    #[test]
    fn probing_gives_every_name_of_a_set_its_own_address() {
        // A pile-up on purpose: every name starts at the same index.
        let mut taken = BTreeMap::new();
        for i in 0..50 {
            let name = format!("n{i}");
            let addr = probe_from(7, &name, &taken);
            assert!(taken.insert(addr, name).is_none());
        }
        assert_eq!(taken.len(), 50);
        assert_eq!(taken.keys().next(), Some(&nth_candidate(7)));
        assert_eq!(taken.keys().last(), Some(&nth_candidate(56)));
    }

    #[test]
    fn candidates_stay_inside_the_allowed_block() {
        assert_eq!(nth_candidate(0), Ipv4Addr::new(127, 0, 0, 2));
        assert_eq!(
            nth_candidate(LOOPBACK_CANDIDATES - 1),
            Ipv4Addr::new(127, 255, 255, 254)
        );
    }
}
