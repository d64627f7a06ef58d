//! Node scoring policies. [`gpu_aware`]: filter nodes that cannot hold a pod's devices and score
//! the rest by the quality of the devices `topology::select` would give it and the loss it
//! leaves behind.

pub mod gpu_aware;
