//! Huawei's within-node rules for the Ascend 910 (Atlas 800: two HCCS rings of 4), checked
//! against `select` over every free set of the node, so `docs/scheduler-extension.md` can say
//! which of them hold here and which do not. `select` itself is not tuned to them: the rules
//! that hold follow from its order (largest `Q`, then smallest cut).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fumarole_topology::{LinkClass, LinkMatrix, SelectContext};

fn atlas() -> SelectContext {
    SelectContext::new(&LinkMatrix::from_fn(8, |a, b| {
        if a / 4 == b / 4 {
            LinkClass::Hccs
        } else {
            LinkClass::CrossNuma
        }
    }))
}

fn free_of(mask: u32) -> Vec<usize> {
    (0..8).filter(|d| mask >> d & 1 == 1).collect()
}

fn ring_free(free: &[usize], ring: usize) -> usize {
    free.iter().filter(|d| *d / 4 == ring).count()
}

/// The counts Huawei allows per pod on this server (8 takes the whole server).
const COUNTS: [usize; 3] = [1, 2, 4];

/// Rule 1, "a request must stay inside one ring": whenever a ring has room, the choice lies
/// inside one ring. Not a hard rule here: when no ring has room the choice spans both (with
/// `q` below 1, so the node scores lower, but it is not filtered).
#[test]
fn a_request_stays_inside_one_ring_when_one_has_room() {
    let ctx = atlas();
    for mask in 0u32..256 {
        let free = free_of(mask);
        for k in COUNTS {
            if free.len() < k {
                continue;
            }
            let s = ctx.select(&free, &[], k).unwrap();
            let rings: std::collections::BTreeSet<usize> =
                s.devices.iter().map(|d| d / 4).collect();
            if (0..2).any(|r| ring_free(&free, r) >= k) {
                assert_eq!(rings.len(), 1, "free {free:?}, k {k}: {:?}", s.devices);
                assert_eq!(s.q, 1.0);
            } else {
                assert_eq!(rings.len(), 2);
                assert!(s.q < 1.0);
            }
        }
    }
}

/// Rule 2, "prefer the ring whose free count matches best": of the rings with room, the one
/// with the fewest free NPUs is taken, so a ring whose free count equals the request always
/// wins (Huawei's first choice: 1 -> a ring with 1 free, 2 -> a ring with 2 free).
#[test]
fn the_best_fitting_ring_is_taken() {
    let ctx = atlas();
    for mask in 0u32..256 {
        let free = free_of(mask);
        for k in COUNTS {
            let fits: Vec<usize> = (0..2).filter(|&r| ring_free(&free, r) >= k).collect();
            if fits.len() < 2 {
                continue;
            }
            let s = ctx.select(&free, &[], k).unwrap();
            let chosen = s.devices[0] / 4;
            let fewest = fits.iter().map(|&r| ring_free(&free, r)).min().unwrap();
            assert_eq!(
                ring_free(&free, chosen),
                fewest,
                "free {free:?}, k {k}: {:?}",
                s.devices
            );
        }
    }
}

/// Rule 3, "prefer servers already partly used": on a server with some NPUs in use the same
/// request has a loss no higher than on an idle server (and `q` 1 while a ring has room), so
/// it scores at least as well there; strictly better when the used NPUs share a ring with
/// the choice's free neighbours.
#[test]
fn partly_used_servers_score_at_least_as_well_as_idle_ones() {
    let ctx = atlas();
    let all: Vec<usize> = (0..8).collect();
    for k in COUNTS {
        let idle = ctx.select(&all, &[], k).unwrap();
        for mask in 0u32..255 {
            let free = free_of(mask);
            if !(0..2).any(|r| ring_free(&free, r) >= k) {
                continue;
            }
            let s = ctx.select(&free, &[], k).unwrap();
            assert_eq!(s.q, 1.0);
            assert!(
                s.loss <= idle.loss,
                "free {free:?}, k {k}: loss {} > idle {}",
                s.loss,
                idle.loss
            );
        }
    }
    // NPU 0 in use: one NPU now scores better here than on an idle server.
    let partly: Vec<usize> = (1..8).collect();
    assert!(ctx.select(&partly, &[], 1).unwrap().loss < ctx.select(&all, &[], 1).unwrap().loss);
}

/// Rule 4, "prefer leaving an even number free in a ring", does NOT hold beyond what best fit
/// gives: one NPU with rings of 3 and 2 free is taken from the ring of 2 (leaving 1, odd;
/// Huawei takes the ring of 3), and two NPUs with rings of 4 and 3 free from the ring of 3
/// (leaving 1; Huawei takes the ring of 4).
#[test]
fn an_even_remainder_is_not_preferred_over_best_fit() {
    let ctx = atlas();
    // Ring 0: 3 free (1, 2, 3); ring 1: 2 free (6, 7).
    let s = ctx.select(&[1, 2, 3, 6, 7], &[], 1).unwrap();
    assert_eq!(s.devices[0] / 4, 1);
    // Ring 0: 4 free; ring 1: 3 free (5, 6, 7).
    let s = ctx.select(&[0, 1, 2, 3, 5, 6, 7], &[], 2).unwrap();
    assert_eq!(s.devices, [5, 6]);
}
