//! The pod set fingerprint of a node, as the `nodeTopologyPodsFingerprint` attribute of its
//! NodeResourceTopology carries it: the scheduler-plugins NodeResourceTopologyMatch cache
//! compares it with the pods it sees on the node to tell whether the object is current.
//!
//! The format is podfingerprint v001 (`github.com/k8stopologyawareschedwg/podfingerprint`,
//! which node-feature-discovery's topology updater uses): each pod is hashed as
//! XXH64(name, seed = XXH64(namespace, seed 0)); the hashes are sorted ascending, written as
//! little-endian u64s into one XXH64 (seed 0), and the sum is printed as 16 hex digits after
//! the `pfp0` prefix and the `v001` version. The pod order does not matter; a pod listed twice
//! counts twice, as in the Go library.
//!
//! Start at [`fingerprint`].

use xxhash_rust::xxh64::{Xxh64, xxh64};

/// The attribute name in NodeResourceTopology (`podfingerprint.Attribute`).
pub const ATTRIBUTE: &str = "nodeTopologyPodsFingerprint";
/// Prefix and version of the format (`podfingerprint.Prefix` + `podfingerprint.Version`).
pub const PREFIX: &str = "pfp0v001";

/// The fingerprint of a set of pods given as (namespace, name).
pub fn fingerprint<'a>(pods: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut hashes: Vec<u64> = pods
        .into_iter()
        .map(|(namespace, name)| xxh64(name.as_bytes(), xxh64(namespace.as_bytes(), 0)))
        .collect();
    hashes.sort_unstable();
    let mut sum = Xxh64::new(0);
    for h in hashes {
        sum.update(&h.to_le_bytes());
    }
    // Go's hash.Hash64.Sum writes the digest big-endian; hex of that is the u64 in hex.
    format!("{PREFIX}{:016x}", sum.digest())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector in podfingerprint v0.2.2's own tests (`tracing_test.go`).
    #[test]
    fn matches_the_go_librarys_published_vector() {
        let pods = [
            ("ns1", "n1"),
            ("ns1", "n2"),
            ("ns2", "n1"),
            ("ns3", "n1"),
            ("ns3", "n2"),
        ];
        assert_eq!(fingerprint(pods), "pfp0v001b92008c14168b3a6");
        // Any order gives the same fingerprint.
        let mut reversed = pods;
        reversed.reverse();
        assert_eq!(fingerprint(reversed), "pfp0v001b92008c14168b3a6");
    }

    #[test]
    fn namespace_and_name_are_not_interchangeable() {
        assert_ne!(fingerprint([("a", "b")]), fingerprint([("b", "a")]));
        assert_ne!(
            fingerprint([("a", "b")]),
            fingerprint([("a", "b"), ("a", "b")])
        );
        assert_eq!(fingerprint([]).len(), PREFIX.len() + 16);
    }
}
