//! `fumarole.dev/devices`: the scheduler extension's device choice for a pod, as the device
//! plugin reads it. The value format is defined once in [`fumarole_topology::annotation`] and
//! re-exported here; how the plugin finds the pod being admitted and honours its choice is
//! [`crate::admission`].

pub use fumarole_topology::annotation::{
    AnnotationError, DEVICES_ANNOTATION, DeviceChoice, format, parse,
};
