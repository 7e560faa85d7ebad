//! Plans (sequences of computes and frees) and the `checkmate-plan/1` file format.

use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeIdx};
use crate::io::{parse_json, read_text, write_text, Fields};

/// The format tag of plan files.
pub const PLAN_FORMAT: &str = "checkmate-plan/1";

/// One step of a plan. Nodes are graph positions ([`NodeIdx`]), not file ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Run the node's operation; its inputs must be live; its output becomes live.
    Compute(NodeIdx),
    /// Drop the node's output.
    Free(NodeIdx),
}

/// A schedule of computes and frees for one training step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The steps, in execution order.
    pub steps: Vec<Step>,
    /// Which implementation each step computes with ([`crate::Node::alternatives`]): empty when
    /// every compute uses its node's default, else one entry per step (0 on frees).
    pub implementations: Vec<u16>,
}

impl Plan {
    /// A plan from its steps, every compute with its node's default implementation.
    pub fn new(steps: Vec<Step>) -> Plan {
        Plan {
            steps,
            implementations: Vec::new(),
        }
    }

    /// The implementation step `k` computes with (0: the default).
    pub fn implementation(&self, k: usize) -> usize {
        self.implementations.get(k).map_or(0, |&i| i as usize)
    }

    /// Whether some step uses an implementation other than its node's default.
    pub fn uses_alternatives(&self) -> bool {
        self.implementations.iter().any(|&i| i != 0)
    }

    /// Number of compute steps.
    pub fn compute_count(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, Step::Compute(_)))
            .count()
    }

    /// How often each node is computed.
    pub fn compute_counts(&self, graph: &Graph) -> Vec<u32> {
        let mut counts = vec![0u32; graph.len()];
        for s in &self.steps {
            if let Step::Compute(v) = *s {
                counts[v] += 1;
            }
        }
        counts
    }
}

/// What a solver predicted for a plan (always computed by the simulator).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Peak activation bytes.
    pub peak_bytes: u64,
    /// Total compute cost.
    pub cost: f64,
}

/// A plan with the metadata of a `checkmate-plan/1` file.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanFile {
    /// Name of the graph the plan is for.
    pub graph: String,
    /// Strategy that produced it.
    pub strategy: String,
    /// The user's total memory budget (static + activations), if any.
    pub budget_bytes: Option<u64>,
    /// Simulated peak and cost.
    pub predicted: Option<Prediction>,
    /// The steps.
    pub plan: Plan,
}

impl PlanFile {
    /// Serializes with the graph's file ids, one step per line.
    pub fn to_json(&self, graph: &Graph) -> String {
        let mut out = String::with_capacity(64 + self.plan.steps.len() * 20);
        out.push_str("{\n");
        out.push_str(&format!("  \"format\": \"{PLAN_FORMAT}\",\n"));
        out.push_str(&format!(
            "  \"graph\": {},\n",
            Value::from(self.graph.as_str())
        ));
        out.push_str(&format!(
            "  \"strategy\": {},\n",
            Value::from(self.strategy.as_str())
        ));
        match self.budget_bytes {
            Some(b) => out.push_str(&format!("  \"budget_bytes\": {b},\n")),
            None => out.push_str("  \"budget_bytes\": null,\n"),
        }
        if let Some(p) = self.predicted {
            out.push_str(&format!(
                "  \"predicted\": {{\"peak_bytes\": {}, \"cost\": {}}},\n",
                p.peak_bytes,
                Value::from(p.cost)
            ));
        }
        out.push_str("  \"steps\": [");
        for (k, s) in self.plan.steps.iter().enumerate() {
            let sep = if k == 0 { "\n" } else { ",\n" };
            let (verb, v) = match *s {
                Step::Compute(v) => ("compute", v),
                Step::Free(v) => ("free", v),
            };
            let imp = self.plan.implementation(k);
            if imp == 0 || imp >= graph.node(v).implementation_count() {
                out.push_str(&format!("{sep}    {{\"{verb}\": {}}}", graph.node(v).id));
            } else {
                out.push_str(&format!(
                    "{sep}    {{\"{verb}\": {}, \"impl\": {}}}",
                    graph.node(v).id,
                    Value::from(graph.node(v).implementation_name(imp))
                ));
            }
        }
        out.push_str("\n  ]\n}\n");
        out
    }

    /// Parses a plan for `graph`; node ids are the graph file's ids. `context` names the source.
    pub fn from_json_str(text: &str, graph: &Graph, context: &str) -> Result<PlanFile> {
        let root = parse_json(text, context)?;
        let top = Fields::of(&root, context)?;
        let format = top.get("format")?;
        if format.as_str() != Some(PLAN_FORMAT) {
            return Err(Error::UnknownFormat {
                found: format.to_string(),
                expected: format!("\"{PLAN_FORMAT}\""),
            });
        }
        let predicted = match top.obj.get("predicted") {
            None | Some(Value::Null) => None,
            Some(p) => {
                let f = Fields::of(p, "predicted")?;
                Some(Prediction {
                    peak_bytes: f.u64("peak_bytes")?,
                    cost: f.cost("cost")?,
                })
            }
        };
        let steps_v = top.array("steps")?;
        let mut steps = Vec::with_capacity(steps_v.len());
        let mut implementations: Vec<u16> = Vec::new();
        for (k, s) in steps_v.iter().enumerate() {
            let f = Fields::of(s, format!("steps[{k}]"))?;
            let (verb, is_compute) = if f.obj.contains_key("compute") {
                ("compute", true)
            } else if f.obj.contains_key("free") {
                ("free", false)
            } else {
                return Err(Error::MissingField {
                    location: f.location.clone(),
                    field: "compute\" or \"free".into(),
                });
            };
            let id = f.u64(verb)?;
            let v = graph.index_of(id).ok_or_else(|| Error::UnknownPlanNode {
                step: k,
                id,
                graph: graph.name().to_string(),
            })?;
            steps.push(if is_compute {
                Step::Compute(v)
            } else {
                Step::Free(v)
            });
            let imp = match f.obj.get("impl") {
                None | Some(Value::Null) => 0,
                Some(name) => {
                    let node = graph.node(v);
                    let found = name
                        .as_str()
                        .filter(|_| is_compute)
                        .and_then(|n| node.implementation_named(n));
                    found.ok_or_else(|| Error::InvalidField {
                        location: f.location.clone(),
                        field: "impl".into(),
                        value: name.to_string(),
                        expected: if is_compute {
                            format!(
                                "an implementation of node {}: {}",
                                graph.label(v),
                                (0..node.implementation_count())
                                    .map(|k| format!("{:?}", node.implementation_name(k)))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        } else {
                            "no `impl` on a free step".into()
                        },
                    })?
                }
            };
            if imp != 0 && implementations.is_empty() {
                implementations = vec![0u16; steps.len() - 1];
            }
            if !implementations.is_empty() {
                implementations.push(imp as u16);
            }
        }
        Ok(PlanFile {
            graph: top.str("graph")?.to_string(),
            strategy: top.str("strategy")?.to_string(),
            budget_bytes: top.opt_u64("budget_bytes")?,
            predicted,
            plan: Plan {
                steps,
                implementations,
            },
        })
    }

    /// Reads a plan file for `graph`.
    pub fn read(path: impl AsRef<Path>, graph: &Graph) -> Result<PlanFile> {
        let path = path.as_ref();
        PlanFile::from_json_str(&read_text(path)?, graph, &path.display().to_string())
    }

    /// Writes the plan file.
    pub fn write(&self, path: impl AsRef<Path>, graph: &Graph) -> Result<()> {
        write_text(path.as_ref(), &self.to_json(graph))
    }
}
