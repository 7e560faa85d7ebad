//! Node costs: FLOPs by default, or a measured `checkmate-costs/1` table applied by node name.

use std::collections::HashMap;
use std::path::Path;

use checkmate_graph::NodeSpec;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The `format` string of cost-table files.
pub const COSTS_FORMAT: &str = "checkmate-costs/1";

/// A measured cost table (SPEC.md section 4): per training-graph node, seconds and output bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostTable {
    /// Always [`COSTS_FORMAT`].
    pub format: String,
    /// The device the costs were measured on, e.g. `cuda:0 (NVIDIA H200)`.
    #[serde(default)]
    pub device: String,
    /// The model (name as given to `model_by_name` or the network's name).
    #[serde(default)]
    pub model: String,
    /// Batch size of the measured graph.
    pub batch: usize,
    /// One entry per node of the training graph.
    pub nodes: Vec<NodeCost>,
    /// The rest of a training step, when the profiler measured it (top-level fields of the
    /// file).
    #[serde(flatten)]
    pub overheads: StepOverheads,
    /// Where the table was read from (for messages); not serialized.
    #[serde(skip)]
    pub source: String,
}

/// The parts of a training step outside the graph's nodes, as `checkmate profile` measures them:
/// optional top-level fields extending `checkmate-costs/1` (absent in older tables, ignored by
/// older readers).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StepOverheads {
    /// Median seconds of one optimizer update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_seconds: Option<f64>,
    /// Median seconds to make one batch (the synthetic data source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_seconds: Option<f64>,
    /// The executor's own time per plan step (compute or free) outside the kernels: simulating
    /// the plan, register and storage bookkeeping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_step_overhead_seconds: Option<f64>,
}

impl StepOverheads {
    /// `(update, batch, executor)` seconds of one training step whose plan has `plan_steps`
    /// steps, when the update and the batch were measured (the executor's part is 0 when not).
    pub fn for_plan(&self, plan_steps: usize) -> Option<(f64, f64, f64)> {
        let executor = self.plan_step_overhead_seconds.unwrap_or(0.0) * plan_steps as f64;
        Some((self.update_seconds?, self.batch_seconds?, executor))
    }
}

/// One node's measured cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeCost {
    /// Node name in the training graph (`block1_conv1`, `Loss`, `block1_conv1_backward`).
    pub name: String,
    /// Median seconds of one compute.
    pub seconds: f64,
    /// Bytes of the node's output tensor.
    pub bytes: u64,
    /// Median seconds of the node's other implementations, by name (docs/IMPLEMENTATIONS.md; an
    /// optional field, absent in older tables).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<AlternativeCost>,
}

/// The measured cost of one alternative implementation of a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlternativeCost {
    /// The implementation's name in the training graph (e.g. `whole-sample`).
    pub name: String,
    /// Median seconds of one compute with it.
    pub seconds: f64,
}

impl CostTable {
    /// A table for `model` at `batch` measured on `device` (no [`StepOverheads`]).
    pub fn new(
        device: impl Into<String>,
        model: impl Into<String>,
        batch: usize,
        nodes: Vec<NodeCost>,
    ) -> CostTable {
        CostTable {
            format: COSTS_FORMAT.into(),
            device: device.into(),
            model: model.into(),
            batch,
            nodes,
            overheads: StepOverheads::default(),
            source: "input".into(),
        }
    }

    /// The granularity of the training graph the table was measured on: operator level when it
    /// names a saved-state node (`L_mask`, `L_indices` beside a node `L`) or a parameter-gradient
    /// node (`L_backward_weight` beside `L_backward`), else layer level.
    pub fn granularity(&self) -> crate::Granularity {
        let names: std::collections::HashSet<&str> =
            self.nodes.iter().map(|n| n.name.as_str()).collect();
        let op = self.nodes.iter().any(|n| {
            let beside = |suffix: &str, other: &str| {
                n.name
                    .strip_suffix(suffix)
                    .is_some_and(|l| names.contains(format!("{l}{other}").as_str()))
            };
            beside("_mask", "") || beside("_indices", "") || beside("_backward_weight", "_backward")
        });
        if op {
            crate::Granularity::Op
        } else {
            crate::Granularity::Layer
        }
    }

    /// Parses a table; `context` names its origin in errors.
    pub fn from_json_str(text: &str, context: &str) -> Result<CostTable> {
        let mut t: CostTable = serde_json::from_str(text).map_err(|source| Error::Json {
            context: context.into(),
            source,
        })?;
        t.source = context.into();
        if t.format != COSTS_FORMAT {
            return Err(t.error(format!(
                "format is {:?}, expected {COSTS_FORMAT:?}",
                t.format
            )));
        }
        Ok(t)
    }

    /// Reads a table from a file.
    pub fn read(path: impl AsRef<Path>) -> Result<CostTable> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        CostTable::from_json_str(&text, &path.display().to_string())
    }

    /// The table as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a cost table always serializes")
    }

    /// Writes the table to a file.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        std::fs::write(path, self.to_json() + "\n").map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })
    }

    fn error(&self, message: String) -> Error {
        Error::CostTable {
            context: self.source.clone(),
            message,
        }
    }

    /// Replaces every node's cost by its measured seconds, matching by name.
    ///
    /// Errors when the batch differs, a node of the graph is missing from the table, the table
    /// names a node the graph lacks, a name repeats, a measured size differs from the graph's
    /// bytes, or a time is negative or not finite.
    pub fn apply(&self, specs: &mut [NodeSpec], batch: usize) -> Result<()> {
        if self.batch != batch {
            return Err(self.error(format!(
                "measured at batch {}, the graph has batch {batch}",
                self.batch
            )));
        }
        let mut by_name: HashMap<&str, &NodeCost> = HashMap::with_capacity(self.nodes.len());
        for n in &self.nodes {
            if by_name.insert(n.name.as_str(), n).is_some() {
                return Err(self.error(format!("node `{}` appears twice", n.name)));
            }
            if !n.seconds.is_finite() || n.seconds < 0.0 {
                return Err(self.error(format!(
                    "node `{}` has seconds {}, expected a finite non-negative number",
                    n.name, n.seconds
                )));
            }
        }
        for s in specs.iter_mut() {
            let Some(n) = by_name.remove(s.name.as_str()) else {
                return Err(self.error(format!(
                    "has no entry for node `{}` of the training graph (is it for another model, \
                     or another --granularity?)",
                    s.name
                )));
            };
            if n.bytes != s.bytes {
                return Err(self.error(format!(
                    "node `{}` measured {} bytes, the training graph has {} bytes",
                    s.name, n.bytes, s.bytes
                )));
            }
            s.cost = n.seconds;
            for a in &n.alternatives {
                if !a.seconds.is_finite() || a.seconds < 0.0 {
                    return Err(self.error(format!(
                        "implementation `{}` of node `{}` has seconds {}, expected a finite \
                         non-negative number",
                        a.name, n.name, a.seconds
                    )));
                }
                if !s.alternatives.iter().any(|i| i.name == a.name) {
                    return Err(self.error(format!(
                        "names implementation `{}` of node `{}`, which the training graph does \
                         not have",
                        a.name, n.name
                    )));
                }
            }
            // An implementation the table did not time counts as slow as the default: with its
            // larger workspace it is then never chosen.
            for alt in &mut s.alternatives {
                alt.cost = n
                    .alternatives
                    .iter()
                    .find(|a| a.name == alt.name)
                    .map_or(n.seconds, |a| a.seconds);
            }
        }
        if !by_name.is_empty() {
            let mut extra: Vec<&str> = by_name.into_keys().collect();
            extra.sort_unstable();
            extra.truncate(5);
            return Err(self.error(format!(
                "names nodes the training graph does not have: {} (is it for another \
                 --granularity?)",
                extra.join(", ")
            )));
        }
        Ok(())
    }
}

/// Where node costs come from.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Costs {
    /// Analytical FLOPs (cost unit `flops`).
    #[default]
    Flops,
    /// A measured table (cost unit `s`).
    Measured(CostTable),
}

impl Costs {
    /// Parses the CLI's `--costs` value: `flops`, or the path of a `checkmate-costs/1` file.
    pub fn from_arg(arg: &str) -> Result<Costs> {
        if arg.eq_ignore_ascii_case("flops") {
            Ok(Costs::Flops)
        } else {
            CostTable::read(arg).map(Costs::Measured)
        }
    }

    /// The cost unit of graphs built with these costs.
    pub fn unit(&self) -> &'static str {
        match self {
            Costs::Flops => "flops",
            Costs::Measured(_) => "s",
        }
    }
}
