//! (De)serialisation of graphs. A graph is written as a list of nodes with their
//! ids and inputs; ids are kept on the way back, so plans that refer to nodes
//! stay valid.

use crate::buffer::ModuleBufferSpec;
use crate::error::IrError;
use crate::graph::{Graph, Module, Node, NodeId, ValueId};
use crate::param::ParamSpec;
use crate::program::TrainingProgram;
use serde::{de::Error, Deserialize, Deserializer, Serialize, Serializer};

#[derive(Serialize, Deserialize)]
struct GraphRepr {
    name: String,
    modules: Vec<Module>,
    params: Vec<ParamSpec>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    buffers: Vec<ModuleBufferSpec>,
    nodes: Vec<NodeRepr>,
    outputs: Vec<ValueId>,
}

#[derive(Serialize, Deserialize)]
struct NodeRepr {
    id: NodeId,
    inputs: Vec<ValueId>,
    #[serde(flatten)]
    node: Node,
}

impl Serialize for Graph {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let nodes = self
            .node_ids()
            .map(|id| NodeRepr {
                id,
                inputs: self.inputs(id),
                node: self.node(id).clone(),
            })
            .collect();
        GraphRepr {
            name: self.name.clone(),
            modules: self.modules.clone(),
            params: self.params.clone(),
            buffers: self.buffers.clone(),
            nodes,
            outputs: self.outputs.clone(),
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Graph {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Graph, D::Error> {
        let r = GraphRepr::deserialize(d)?;
        Graph::from_parts(
            r.name,
            r.modules,
            r.params,
            r.buffers,
            r.nodes.into_iter().map(|n| (n.id, n.node, n.inputs)),
            r.outputs,
        )
        .map_err(D::Error::custom)
    }
}

impl Graph {
    /// The graph as pretty-printed JSON (node ids kept).
    pub fn to_json(&self) -> Result<String, IrError> {
        serde_json::to_string_pretty(self).map_err(|e| IrError::Json(e.to_string()))
    }

    /// A graph from JSON written by `to_json` (node ids kept).
    pub fn from_json(text: &str) -> Result<Graph, IrError> {
        serde_json::from_str(text).map_err(|e| IrError::Json(e.to_string()))
    }
}

impl TrainingProgram {
    /// The program as pretty-printed JSON (node ids kept).
    pub fn to_json(&self) -> Result<String, IrError> {
        serde_json::to_string_pretty(self).map_err(|e| IrError::Json(e.to_string()))
    }

    /// A program from JSON written by `to_json` (node ids kept).
    pub fn from_json(text: &str) -> Result<TrainingProgram, IrError> {
        serde_json::from_str(text).map_err(|e| IrError::Json(e.to_string()))
    }
}
