//! A hash map whose copies share what they have not changed ([`CowMap`]), so the live view
//! can derive a new [`super::view::ClusterView`] from the last one at the cost of what an
//! event touched, while requests still read the last one.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

/// Shards of a [`CowMap`]: a copy of the map copies this many pointers, and a write into a
/// shared map copies one shard (a 256th of the entries).
const SHARDS: usize = 256;

/// A hash map split into [`SHARDS`] shards, each behind an `Arc`: cloning copies the shard
/// pointers, and a write copies only the shard it lands in when another copy shares it.
/// Iteration order is the shards' order, not insertion order.
#[derive(Clone)]
pub struct CowMap<K, V> {
    /// Empty until the first insert (most maps of a small view stay empty).
    shards: Vec<Arc<HashMap<K, V>>>,
    len: usize,
}

impl<K, V> Default for CowMap<K, V> {
    fn default() -> Self {
        CowMap {
            shards: Vec::new(),
            len: 0,
        }
    }
}

impl<K: std::fmt::Debug, V: std::fmt::Debug> std::fmt::Debug for CowMap<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// The shard of a key: a fixed hash, the same for a key and what it borrows as.
fn shard_of<Q: Hash + ?Sized>(key: &Q) -> usize {
    let hash = foldhash::fast::FixedState::with_seed(0x5eed).hash_one(key);
    // The top bits: the inner maps use the low ones.
    (hash >> 56) as usize % SHARDS
}

impl<K, V> CowMap<K, V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every entry, shard by shard.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        self.shards.iter().flat_map(|s| s.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.iter().map(|(_, v)| v)
    }
}

impl<K: Hash + Eq + Clone, V: Clone> CowMap<K, V> {
    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.shards.get(shard_of(key))?.get(key)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key).is_some()
    }

    /// The shard of `key`, copied first if another map shares it.
    fn shard_mut<Q: Hash + ?Sized>(&mut self, key: &Q) -> &mut HashMap<K, V> {
        if self.shards.is_empty() {
            self.shards = (0..SHARDS).map(|_| Arc::default()).collect();
        }
        let i = shard_of(key);
        // `shards` has SHARDS entries and `i < SHARDS`.
        Arc::make_mut(&mut self.shards[i])
    }

    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let old = self.shard_mut(&key).insert(key, value);
        if old.is_none() {
            self.len += 1;
        }
        old
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Nothing to copy when the key is not there.
        self.get(key)?;
        let old = self.shard_mut(key).remove(key);
        if old.is_some() {
            self.len -= 1;
        }
        old
    }

    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(key)?;
        self.shard_mut(key).get_mut(key)
    }

    /// The value of `key`, inserted as `V::default()` if absent.
    pub fn get_or_default(&mut self, key: K) -> &mut V
    where
        V: Default,
    {
        let len = &mut self.len;
        if self.shards.is_empty() {
            self.shards = (0..SHARDS).map(|_| Arc::default()).collect();
        }
        let i = shard_of(&key);
        let shard = Arc::make_mut(&mut self.shards[i]);
        shard.entry(key).or_insert_with(|| {
            *len += 1;
            V::default()
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_copy_keeps_its_entries_while_the_original_changes() {
        let mut a: CowMap<String, u32> = CowMap::default();
        assert!(a.get("x").is_none() && a.is_empty());
        for i in 0..2000 {
            a.insert(format!("k{i}"), i);
        }
        let b = a.clone();
        assert_eq!(a.remove("k7"), Some(7));
        assert_eq!(a.remove("k7"), None);
        *a.get_mut("k8").unwrap() = 80;
        *a.get_or_default("new".into()) += 5;
        a.insert("k9".into(), 90);
        assert_eq!((a.len(), b.len()), (2000, 2000));
        assert_eq!(
            (a.get("k7"), a.get("k8"), a.get("k9"), a.get("new")),
            (None, Some(&80), Some(&90), Some(&5))
        );
        assert_eq!(
            (b.get("k7"), b.get("k8"), b.get("k9"), b.get("new")),
            (Some(&7), Some(&8), Some(&9), None)
        );
        // Shards no write touched are still shared.
        let shared = a
            .shards
            .iter()
            .zip(&b.shards)
            .filter(|(x, y)| Arc::ptr_eq(x, y))
            .count();
        assert_eq!(shared, SHARDS - 4, "four writes, four shards copied");
        assert_eq!(a.iter().count(), a.len());
        assert_eq!(b.values().copied().map(u64::from).sum::<u64>(), 1999 * 1000);
    }
}
