//! Reading and writing graphs: `checkmate-graph/1` JSON and networkx node-link imports.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::graph::{Graph, Implementation, NodeKind, NodeSpec};

/// The format tag of graph files.
pub const GRAPH_FORMAT: &str = "checkmate-graph/1";

pub(crate) fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

pub(crate) fn parse_json(text: &str, context: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| Error::Json {
        context: context.to_string(),
        source,
    })
}

/// Typed access to the fields of one JSON object, with errors that name the object.
pub(crate) struct Fields<'a> {
    pub(crate) obj: &'a Map<String, Value>,
    pub(crate) location: String,
}

impl<'a> Fields<'a> {
    pub(crate) fn of(value: &'a Value, location: impl Into<String>) -> Result<Self> {
        let location = location.into();
        match value.as_object() {
            Some(obj) => Ok(Fields { obj, location }),
            None => Err(Error::InvalidField {
                location,
                field: "(self)".into(),
                value: truncate(value),
                expected: "a JSON object".into(),
            }),
        }
    }

    pub(crate) fn get(&self, field: &str) -> Result<&'a Value> {
        self.obj.get(field).ok_or_else(|| Error::MissingField {
            location: self.location.clone(),
            field: field.into(),
        })
    }

    fn invalid(&self, field: &str, value: &Value, expected: &str) -> Error {
        Error::InvalidField {
            location: self.location.clone(),
            field: field.into(),
            value: truncate(value),
            expected: expected.into(),
        }
    }

    pub(crate) fn u64(&self, field: &str) -> Result<u64> {
        let v = self.get(field)?;
        as_u64(v).ok_or_else(|| self.invalid(field, v, "a non-negative integer"))
    }

    pub(crate) fn opt_u64(&self, field: &str) -> Result<Option<u64>> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.u64(field).map(Some),
        }
    }

    pub(crate) fn cost(&self, field: &str) -> Result<f64> {
        let v = self.get(field)?;
        match v.as_f64() {
            Some(c) if c.is_finite() && c >= 0.0 => Ok(c),
            _ => Err(self.invalid(field, v, "a finite, non-negative number")),
        }
    }

    pub(crate) fn str(&self, field: &str) -> Result<&'a str> {
        let v = self.get(field)?;
        v.as_str().ok_or_else(|| self.invalid(field, v, "a string"))
    }

    pub(crate) fn array(&self, field: &str) -> Result<&'a Vec<Value>> {
        let v = self.get(field)?;
        v.as_array()
            .ok_or_else(|| self.invalid(field, v, "an array"))
    }

    pub(crate) fn bool(&self, field: &str) -> Result<bool> {
        let v = self.get(field)?;
        v.as_bool()
            .ok_or_else(|| self.invalid(field, v, "true or false"))
    }
}

/// An integer JSON number (also `3.0`), non-negative.
fn as_u64(v: &Value) -> Option<u64> {
    if let Some(u) = v.as_u64() {
        return Some(u);
    }
    let f = v.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 1.8e19).then_some(f as u64)
}

/// A node id: an integer, or a string holding one (networkx writes both).
fn as_id(v: &Value) -> Option<u64> {
    as_u64(v).or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

fn truncate(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 60 {
        format!(
            "{}...",
            &s[..s
                .char_indices()
                .take(57)
                .last()
                .map_or(0, |(i, c)| i + c.len_utf8())]
        )
    } else {
        s
    }
}

impl Graph {
    /// Reads a graph file in any supported format (see [`Graph::from_json_str`]).
    pub fn read(path: impl AsRef<Path>) -> Result<Graph> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Graph::from_json_str(&text, &path.display().to_string())
    }

    /// Parses `checkmate-graph/1`, Checkmate's networkx node-link export (`backward`, `cost_cpu`,
    /// `cost_ram`) or the random layered variant (`name` as id, `duration`, `out_cost`).
    /// `context` names the source in errors.
    pub fn from_json_str(text: &str, context: &str) -> Result<Graph> {
        let root = parse_json(text, context)?;
        let top = Fields::of(&root, context)?;
        if let Some(format) = top.obj.get("format") {
            return match format.as_str() {
                Some(GRAPH_FORMAT) => parse_native(&top),
                _ => Err(Error::UnknownFormat {
                    found: truncate(format),
                    expected: format!("\"{GRAPH_FORMAT}\" or networkx node-link JSON"),
                }),
            };
        }
        if top.obj.contains_key("nodes")
            && (top.obj.contains_key("links") || top.obj.contains_key("edges"))
        {
            return parse_node_link(&top);
        }
        Err(Error::UnknownFormat {
            found: "an object with neither `format` nor `nodes` + `links`".into(),
            expected: format!("\"{GRAPH_FORMAT}\" or networkx node-link JSON"),
        })
    }

    /// Serializes as `checkmate-graph/1`, nodes in topological order, ids preserved.
    pub fn to_json(&self) -> String {
        let nodes: Vec<Value> = self
            .to_specs()
            .into_iter()
            .map(|s| {
                let mut m = Map::new();
                m.insert("id".into(), s.id.into());
                m.insert("name".into(), s.name.into());
                m.insert("kind".into(), s.kind.as_str().into());
                m.insert("cost".into(), s.cost.into());
                m.insert("bytes".into(), s.bytes.into());
                m.insert("deps".into(), s.deps.into());
                if s.workspace_bytes > 0 {
                    m.insert("workspace_bytes".into(), s.workspace_bytes.into());
                }
                if !s.alternatives.is_empty() {
                    let alts: Vec<Value> = s
                        .alternatives
                        .iter()
                        .map(|a| {
                            let mut m = Map::new();
                            m.insert("name".into(), a.name.clone().into());
                            m.insert("cost".into(), a.cost.into());
                            m.insert("workspace_bytes".into(), a.workspace_bytes.into());
                            Value::Object(m)
                        })
                        .collect();
                    m.insert("alternatives".into(), alts.into());
                }
                Value::Object(m)
            })
            .collect();
        let mut out = String::new();
        out.push_str("{\n");
        out.push_str(&format!("  \"format\": \"{GRAPH_FORMAT}\",\n"));
        out.push_str(&format!("  \"name\": {},\n", Value::from(self.name())));
        out.push_str(&format!(
            "  \"cost_unit\": {},\n",
            Value::from(self.cost_unit())
        ));
        out.push_str(&format!("  \"static_bytes\": {},\n", self.static_bytes()));
        out.push_str("  \"nodes\": [\n");
        for (i, n) in nodes.iter().enumerate() {
            let sep = if i + 1 < nodes.len() { "," } else { "" };
            out.push_str(&format!("    {n}{sep}\n"));
        }
        out.push_str("  ]\n}\n");
        out
    }

    /// Writes [`Graph::to_json`] to `path`.
    pub fn write(&self, path: impl AsRef<Path>) -> Result<()> {
        write_text(path.as_ref(), &self.to_json())
    }
}

fn parse_native(top: &Fields) -> Result<Graph> {
    let name = top.str("name")?.to_string();
    let cost_unit = match top.obj.get("cost_unit") {
        None => "unit".to_string(),
        Some(_) => top.str("cost_unit")?.to_string(),
    };
    let static_bytes = top.opt_u64("static_bytes")?.unwrap_or(0);
    let nodes = top.array("nodes")?;
    let mut specs = Vec::with_capacity(nodes.len());
    for (k, v) in nodes.iter().enumerate() {
        let loc = node_location(v, k);
        let f = Fields::of(v, loc)?;
        let id = f.u64("id")?;
        let kind = match f.str("kind")? {
            "forward" => NodeKind::Forward,
            "loss" => NodeKind::Loss,
            "backward" => NodeKind::Backward,
            other => {
                return Err(Error::InvalidField {
                    location: f.location.clone(),
                    field: "kind".into(),
                    value: format!("{other:?}"),
                    expected: "\"forward\", \"loss\" or \"backward\"".into(),
                })
            }
        };
        let deps_v = f.array("deps")?;
        let mut deps = Vec::with_capacity(deps_v.len());
        for d in deps_v {
            deps.push(as_u64(d).ok_or_else(|| Error::InvalidField {
                location: f.location.clone(),
                field: "deps".into(),
                value: truncate(d),
                expected: "node ids (non-negative integers)".into(),
            })?);
        }
        let mut alternatives = Vec::new();
        if !matches!(f.obj.get("alternatives"), None | Some(Value::Null)) {
            for (j, a) in f.array("alternatives")?.iter().enumerate() {
                let af = Fields::of(a, format!("{} alternatives[{j}]", f.location))?;
                alternatives.push(Implementation {
                    name: af.str("name")?.to_string(),
                    cost: af.cost("cost")?,
                    workspace_bytes: af.opt_u64("workspace_bytes")?.unwrap_or(0),
                });
            }
        }
        specs.push(NodeSpec {
            id,
            name: f.str("name")?.to_string(),
            kind,
            cost: f.cost("cost")?,
            bytes: f.u64("bytes")?,
            workspace_bytes: f.opt_u64("workspace_bytes")?.unwrap_or(0),
            deps,
            alternatives,
        });
    }
    Graph::new(name, cost_unit, static_bytes, specs)
}

/// `node 3 (conv1)` when the node has an id and name, else `nodes[k]`.
fn node_location(v: &Value, k: usize) -> String {
    let id = v
        .get("id")
        .and_then(as_id)
        .or_else(|| v.get("name").and_then(as_id));
    let name = v.get("name").and_then(Value::as_str);
    match (id, name) {
        (Some(id), Some(name)) => format!("node {id} ({name})"),
        (Some(id), None) => format!("node {id}"),
        _ => format!("nodes[{k}]"),
    }
}

/// The two networkx node-link variants found in Checkmate's and Moccasin's exports.
enum NodeLink {
    /// `id`, `name`, `backward`, `cost_cpu`, `cost_ram`.
    Checkmate,
    /// `name` (the id), `duration`, `out_cost`; forward only.
    RandomLayered,
}

fn parse_node_link(top: &Fields) -> Result<Graph> {
    let nodes = top.array("nodes")?;
    let links = match top.obj.get("links") {
        Some(_) => top.array("links")?,
        None => top.array("edges")?,
    };
    let variant = match nodes.first() {
        Some(n) if n.get("cost_cpu").is_some() || n.get("backward").is_some() => {
            NodeLink::Checkmate
        }
        Some(n) if n.get("duration").is_some() || n.get("out_cost").is_some() => {
            NodeLink::RandomLayered
        }
        Some(_) => {
            return Err(Error::UnknownFormat {
                found: "node-link JSON whose nodes have neither `cost_cpu` nor `duration`".into(),
                expected: "Checkmate's export (`backward`, `cost_cpu`, `cost_ram`) or the random \
                           layered one (`duration`, `out_cost`)"
                    .into(),
            })
        }
        None => {
            return Err(Error::InvalidField {
                location: "graph".into(),
                field: "nodes".into(),
                value: "[]".into(),
                expected: "at least one node".into(),
            })
        }
    };
    let graph_attrs = top.obj.get("graph");
    let mut specs = Vec::with_capacity(nodes.len());
    let mut is_backward = Vec::with_capacity(nodes.len());
    for (k, v) in nodes.iter().enumerate() {
        let f = Fields::of(v, node_location(v, k))?;
        let spec = match variant {
            NodeLink::Checkmate => {
                let id_v = f.get("id")?;
                let id =
                    as_id(id_v).ok_or_else(|| f.invalid("id", id_v, "a non-negative integer"))?;
                is_backward.push(f.bool("backward")?);
                NodeSpec {
                    alternatives: Vec::new(),
                    id,
                    name: f.str("name")?.to_string(),
                    kind: NodeKind::Forward,
                    cost: f.cost("cost_cpu")?,
                    bytes: f.u64("cost_ram")?,
                    workspace_bytes: 0,
                    deps: Vec::new(),
                }
            }
            NodeLink::RandomLayered => {
                let id_v = f.get("name")?;
                let id = as_id(id_v)
                    .ok_or_else(|| f.invalid("name", id_v, "a non-negative integer id"))?;
                is_backward.push(false);
                NodeSpec {
                    alternatives: Vec::new(),
                    id,
                    name: format!("n{id}"),
                    kind: NodeKind::Forward,
                    cost: f.cost("duration")?,
                    bytes: f.u64("out_cost")?,
                    workspace_bytes: 0,
                    deps: Vec::new(),
                }
            }
        };
        specs.push(spec);
    }
    let pos_of: std::collections::HashMap<u64, usize> =
        specs.iter().enumerate().map(|(p, s)| (s.id, p)).collect();
    let (src_key, dst_key) = match variant {
        NodeLink::Checkmate => ("source", "target"),
        NodeLink::RandomLayered => ("0", "1"),
    };
    for (k, l) in links.iter().enumerate() {
        let f = Fields::of(l, format!("links[{k}]"))?;
        let s_v = f.get(src_key)?;
        let t_v = f.get(dst_key)?;
        let s = as_id(s_v).ok_or_else(|| f.invalid(src_key, s_v, "a node id"))?;
        let t = as_id(t_v).ok_or_else(|| f.invalid(dst_key, t_v, "a node id"))?;
        match pos_of.get(&t) {
            Some(&p) => specs[p].deps.push(s),
            None => {
                return Err(Error::InvalidField {
                    location: f.location.clone(),
                    field: dst_key.into(),
                    value: t.to_string(),
                    expected: "the id of a node in `nodes`".into(),
                })
            }
        }
    }
    // A backward node whose inputs are all forward is the loss.
    if matches!(variant, NodeLink::Checkmate) {
        for p in 0..specs.len() {
            if is_backward[p] {
                let all_fwd = specs[p]
                    .deps
                    .iter()
                    .all(|d| pos_of.get(d).is_some_and(|&q| !is_backward[q]));
                specs[p].kind = if all_fwd {
                    NodeKind::Loss
                } else {
                    NodeKind::Backward
                };
            }
        }
    }
    let name = graph_attrs
        .and_then(|g| g.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("imported")
        .to_string();
    let unit = match variant {
        NodeLink::Checkmate => "cost_cpu",
        NodeLink::RandomLayered => "duration",
    };
    Graph::new(name, unit, 0, specs)
}
