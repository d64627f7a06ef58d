//! The background loops the service runs beside answering the schedulers, one module each;
//! each writes its own objects, and only while this replica leads:
//!
//! - [`leader`]: leader election over a Lease (who may hand out devices);
//! - [`terms`]: what a term begins and ends with (adopting the last leader's promises, the
//!   leader label);
//! - [`bound_pods`]: devices written after the fact on pods bound by a scheduler that does
//!   not tell its choice;
//! - [`hypernode`]: Volcano `HyperNode` objects for the super-nodes;
//! - [`dead_agents`]: what a dead co-location agent leaves on its node.
//!
//! The binary's `serve` starts [`leader`] and [`dead_agents`]; the live view
//! ([`crate::live`]) runs the others after each rebuild.

pub mod bound_pods;
pub mod dead_agents;
pub mod hypernode;
pub mod leader;
pub mod terms;
