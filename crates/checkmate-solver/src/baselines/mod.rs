//! Baseline strategies from the literature, generalized to DAGs as in the Checkmate paper.
//!
//! Each picks a set of forward checkpoints; [`schedule_from_checkpoints`] turns it into the `S`
//! matrix and Algorithm 2 gives the cheapest `R` for it.

mod simple;

pub use simple::{CheckpointAll, CheckpointLast};

use checkmate_graph::{Graph, NodeKind, Schedule};
use fixedbitset::FixedBitSet;

/// The schedule that keeps every checkpoint (and every loss/backward output) from the stage after
/// it is computed until its last consumer, recomputing all other forward tensors where needed.
pub fn schedule_from_checkpoints(graph: &Graph, is_checkpoint: &[bool]) -> Schedule {
    let n = graph.len();
    let last_consumer: Vec<usize> = (0..n)
        .map(|i| graph.succs(i).last().copied().unwrap_or(i))
        .collect();
    let keep: Vec<FixedBitSet> = (0..n)
        .map(|t| {
            let mut row = FixedBitSet::with_capacity(n);
            for i in 0..t {
                let kept_kind = graph.node(i).kind != NodeKind::Forward || is_checkpoint[i];
                if kept_kind && last_consumer[i] >= t {
                    row.insert(i);
                }
            }
            row
        })
        .collect();
    Schedule::cheapest_given_keeps(graph, keep).expect("keeps only tensors computed earlier")
}
