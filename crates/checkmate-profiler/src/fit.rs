//! Costs for batch sizes that were not profiled: a least-squares line in the batch size per node.

use checkmate_models::{CostTable, NodeCost};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::profile::{same_nodes, Profile};
use crate::stats::LinearFit;

/// One node's fitted law `seconds = a + b * batch` (and `bytes = c + d * batch`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeFit {
    /// Node name.
    pub name: String,
    /// Seconds as a line in the batch size.
    pub seconds: LinearFit,
    /// Output bytes as a line in the batch size (exact for every zoo model).
    pub bytes: LinearFit,
}

/// Fit quality over all nodes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FitQuality {
    /// The summed medians (one checkpoint-all step) fitted as a line: its R^2.
    pub total_r2: f64,
    /// The summed medians' largest relative residual.
    pub total_max_rel_residual: f64,
    /// Median R^2 over nodes.
    pub median_node_r2: f64,
    /// R^2 over nodes weighted by their share of the time.
    pub weighted_node_r2: f64,
    /// Largest relative residual of any node carrying at least 1% of the step's time.
    pub max_rel_residual_major: f64,
    /// Largest relative residual of any node.
    pub max_rel_residual: f64,
}

/// Per-node lines fitted to profiles of one model on one device at several batch sizes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CostFit {
    /// The device of the profiles.
    pub device: String,
    /// The model of the profiles.
    pub model: String,
    /// The profiled batch sizes, ascending.
    pub batches: Vec<usize>,
    /// One fit per node, graph order.
    pub nodes: Vec<NodeFit>,
    /// The summed medians fitted as a line.
    pub total: LinearFit,
    /// Summary of the fit quality.
    pub quality: FitQuality,
}

/// Fits `seconds = a + b * batch` per node by least squares over `profiles` (one model, one
/// device, at least two distinct batch sizes). Bytes are fitted the same way and must come out
/// exact (they are linear in the batch for every layer).
pub fn fit(profiles: &[Profile]) -> Result<CostFit> {
    let Some(first) = profiles.first() else {
        return Err(Error::Fit("no profiles".into()));
    };
    for p in profiles {
        same_nodes(first, p)?;
        if p.model != first.model || p.device != first.device {
            return Err(Error::Fit(format!(
                "profiles of {} on {} and {} on {} cannot be fitted together",
                first.model, first.device, p.model, p.device
            )));
        }
    }
    let mut batches: Vec<usize> = profiles.iter().map(|p| p.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    if batches.len() < 2 {
        return Err(Error::Fit(format!(
            "need profiles at two or more batch sizes, got {batches:?}"
        )));
    }
    let xs: Vec<f64> = profiles.iter().map(|p| p.batch as f64).collect();
    let line = |ys: &[f64]| LinearFit::fit(&xs, ys).expect("two distinct batch sizes");
    let totals: Vec<f64> = profiles.iter().map(Profile::total_seconds).collect();
    let total = line(&totals);
    let mean_total = totals.iter().sum::<f64>() / totals.len() as f64;
    let mut nodes = Vec::with_capacity(first.nodes.len());
    let mut r2s = Vec::with_capacity(first.nodes.len());
    let (mut wr2, mut wsum) = (0.0, 0.0);
    let (mut max_rel, mut max_rel_major) = (0.0f64, 0.0f64);
    for (i, n) in first.nodes.iter().enumerate() {
        let secs: Vec<f64> = profiles.iter().map(|p| p.nodes[i].seconds).collect();
        let bytes: Vec<f64> = profiles.iter().map(|p| p.nodes[i].bytes as f64).collect();
        let s = line(&secs);
        let b = line(&bytes);
        if b.max_rel_residual > 1e-9 {
            return Err(Error::Fit(format!(
                "node `{}`: output bytes {bytes:?} at batches {xs:?} are not linear in the batch",
                n.name
            )));
        }
        let mean = secs.iter().sum::<f64>() / secs.len() as f64;
        r2s.push(s.r2);
        wr2 += s.r2 * mean;
        wsum += mean;
        max_rel = max_rel.max(s.max_rel_residual);
        if mean >= 0.01 * mean_total {
            max_rel_major = max_rel_major.max(s.max_rel_residual);
        }
        nodes.push(NodeFit {
            name: n.name.clone(),
            seconds: s,
            bytes: b,
        });
    }
    r2s.sort_by(f64::total_cmp);
    let quality = FitQuality {
        total_r2: total.r2,
        total_max_rel_residual: total.max_rel_residual,
        median_node_r2: crate::stats::quantile_sorted(&r2s, 0.5),
        weighted_node_r2: if wsum > 0.0 { wr2 / wsum } else { 1.0 },
        max_rel_residual_major: max_rel_major,
        max_rel_residual: max_rel,
    };
    Ok(CostFit {
        device: first.device.clone(),
        model: first.model.clone(),
        batches,
        nodes,
        total,
        quality,
    })
}

impl CostFit {
    /// The cost table predicted for `batch`: per node the fitted seconds (negative predictions,
    /// possible for tiny nodes below the smallest profiled batch, are clamped to 0) and the fitted
    /// bytes.
    pub fn predict(&self, batch: usize) -> CostTable {
        let x = batch as f64;
        CostTable::new(
            format!("{} (fitted from batches {:?})", self.device, self.batches),
            self.model.clone(),
            batch,
            self.nodes
                .iter()
                .map(|n| NodeCost {
                    name: n.name.clone(),
                    seconds: n.seconds.at(x).max(0.0),
                    bytes: n.bytes.at(x).round().max(0.0) as u64,
                    // (Fitted tables time default kernels only: alternatives then count as slow
                    // as the default and are never chosen.)
                    alternatives: Vec::new(),
                })
                .collect(),
        )
    }

    /// The fitted total seconds of one checkpoint-all step at `batch`.
    pub fn total_at(&self, batch: usize) -> f64 {
        self.total.at(batch as f64)
    }
}

/// Compares a predicted table with a measured one of the same graph: the relative error of the
/// summed seconds, and the largest relative error of a node carrying at least 1% of the time.
pub fn compare_tables(predicted: &CostTable, measured: &CostTable) -> Result<(f64, f64)> {
    if predicted.nodes.len() != measured.nodes.len()
        || predicted
            .nodes
            .iter()
            .zip(&measured.nodes)
            .any(|(a, b)| a.name != b.name)
    {
        return Err(Error::Fit("tables of different graphs".into()));
    }
    let tp: f64 = predicted.nodes.iter().map(|n| n.seconds).sum();
    let tm: f64 = measured.nodes.iter().map(|n| n.seconds).sum();
    let worst = predicted
        .nodes
        .iter()
        .zip(&measured.nodes)
        .filter(|(_, m)| m.seconds >= 0.01 * tm)
        .map(|(p, m)| (p.seconds - m.seconds).abs() / m.seconds)
        .fold(0.0f64, f64::max);
    Ok(((tp - tm) / tm, worst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile::{NodeProfile, ProfileMeta};
    use crate::stats::Summary;

    /// A profile whose node `i` takes `a_i + b_i * batch` seconds (plus `noise(i, batch)`) and
    /// `(i + 1) * 1000 * batch` bytes.
    fn synthetic(batch: usize, laws: &[(f64, f64)], noise: impl Fn(usize) -> f64) -> Profile {
        let nodes = laws
            .iter()
            .enumerate()
            .map(|(i, &(a, b))| {
                let s = a + b * batch as f64 + noise(i);
                NodeProfile {
                    name: format!("n{i}"),
                    seconds: s,
                    bytes: (i as u64 + 1) * 1000 * batch as u64,
                    kind: "forward".into(),
                    q1_seconds: s,
                    q3_seconds: s,
                    min_seconds: s,
                    samples: 1,
                    workspace_bytes: None,
                    alternatives: Vec::new(),
                }
            })
            .collect();
        Profile {
            format: checkmate_models::COSTS_FORMAT.into(),
            device: "test".into(),
            model: "law".into(),
            batch,
            nodes,
            overheads: Default::default(),
            profile: ProfileMeta {
                warmup: 0,
                repeats: 1,
                target_rel_error: 0.0,
                rel_error: 0.0,
                step: Summary::of(&[1.0]),
                wall_seconds: 0.0,
                timer: "synthetic".into(),
                workspace: "none".into(),
                peak_device_bytes: None,
                event_step_seconds: None,
            },
        }
    }

    #[test]
    fn fitting_recovers_a_linear_law() {
        let laws = [(1e-4, 2e-3), (0.0, 5e-4), (3e-3, 0.0)];
        let profiles: Vec<Profile> = [2, 4, 8]
            .iter()
            .map(|&b| synthetic(b, &laws, |_| 0.0))
            .collect();
        let f = fit(&profiles).unwrap();
        assert_eq!(f.batches, vec![2, 4, 8]);
        for (n, &(a, b)) in f.nodes.iter().zip(&laws) {
            assert!((n.seconds.intercept - a).abs() < 1e-12, "{n:?}");
            assert!((n.seconds.slope - b).abs() < 1e-12, "{n:?}");
            assert!((n.seconds.r2 - 1.0).abs() < 1e-9);
        }
        assert!(f.quality.max_rel_residual < 1e-9);
        // An unprofiled batch: seconds from the law, bytes exact.
        let t = f.predict(6);
        assert_eq!(t.batch, 6);
        for (i, (n, &(a, b))) in t.nodes.iter().zip(&laws).enumerate() {
            assert!((n.seconds - (a + 6.0 * b)).abs() < 1e-12);
            assert_eq!(n.bytes, (i as u64 + 1) * 6000);
        }
        assert!((f.total_at(6) - t.nodes.iter().map(|n| n.seconds).sum::<f64>()).abs() < 1e-12);
    }

    #[test]
    fn fit_quality_shows_noise() {
        let laws = [(0.0, 1e-3), (0.0, 1e-3)];
        // Node 1 is 20% off at batch 4.
        let profiles: Vec<Profile> = [2, 4, 8]
            .iter()
            .map(|&b| synthetic(b, &laws, |i| if i == 1 && b == 4 { 8e-4 } else { 0.0 }))
            .collect();
        let f = fit(&profiles).unwrap();
        assert!((f.nodes[0].seconds.r2 - 1.0).abs() < 1e-9);
        assert!(f.nodes[1].seconds.r2 < 0.99);
        assert!(f.quality.max_rel_residual > 0.05);
        assert_eq!(f.quality.max_rel_residual, f.quality.max_rel_residual_major);
    }

    #[test]
    fn fit_rejects_one_batch_size_and_mixed_models() {
        let laws = [(0.0, 1e-3)];
        let p = synthetic(2, &laws, |_| 0.0);
        assert!(fit(&[p.clone(), p.clone()]).is_err());
        let mut q = synthetic(4, &laws, |_| 0.0);
        q.model = "other".into();
        assert!(fit(&[p.clone(), q]).is_err());
        let mut r = synthetic(4, &laws, |_| 0.0);
        r.nodes[0].name = "renamed".into();
        assert!(fit(&[p, r]).is_err());
        assert!(fit(&[]).is_err());
    }

    #[test]
    fn negative_extrapolation_is_clamped() {
        let laws = [(-1e-3, 1e-3)];
        let profiles: Vec<Profile> = [2, 4]
            .iter()
            .map(|&b| synthetic(b, &laws, |_| 0.0))
            .collect();
        let t = fit(&profiles).unwrap().predict(0);
        assert_eq!(t.nodes[0].seconds, 0.0);
    }
}
