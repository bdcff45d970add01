//! The data-flow graph: functions of nodes over typed tensor values.

use cranelift_entity::{entity_impl, EntityRef, PrimaryMap};

use crate::dim::Dim;
use crate::ops::Op;
pub use crate::types::{Signature, TensorType};

/// A tensor value (a function parameter or a node result). Printed `%v3` unless named.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(u32);
entity_impl!(Value, "v");

/// A node: one op applied to values. Printed `n3` in errors.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Node(u32);
entity_impl!(Node, "n");

/// A function of the graph. Printed `f0`; in the text format functions go by `@name`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncId(u32);
entity_impl!(FuncId, "f");


/// Where a value comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueDef {
    /// The function's parameter at this position.
    Param(usize),
    /// Result `index` of a node.
    Result(Node, usize),
}

/// A value's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueData {
    /// Declared type; the verifier checks it against the defining op's shape rule.
    pub ty: TensorType,
    /// Definition site.
    pub def: ValueDef,
    /// Optional name (weights, inputs, `let` bindings); unique within a function.
    pub name: Option<String>,
}

/// A node's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeData {
    /// What is computed.
    pub op: Op,
    /// Operands, in the op table's order.
    pub inputs: Vec<Value>,
    /// Results (one for most ops; `kv_append` has two, `call` as many as the callee returns).
    pub results: Vec<Value>,
}

/// A function: parameters, nodes in a topological order, outputs.
///
/// **Invariant:** nodes are stored in an order where every operand is defined before use (a
/// parameter or an earlier node's result); the builder and the parser only ever append, and the
/// verifier checks it for graphs made any other way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Function {
    /// Name, unique in the graph; printed `@name`.
    pub name: String,
    /// Parameter values, in order.
    pub params: Vec<Value>,
    /// Returned values, in order.
    pub outputs: Vec<Value>,
    /// Nodes, in topological (definition) order.
    pub nodes: PrimaryMap<Node, NodeData>,
    /// Every value: parameters first, then node results in definition order.
    pub values: PrimaryMap<Value, ValueData>,
}

impl Function {
    /// An empty function.
    pub fn new(name: impl Into<String>) -> Function {
        Function { name: name.into(), params: vec![], outputs: vec![], nodes: PrimaryMap::new(), values: PrimaryMap::new() }
    }

    /// Adds a parameter.
    pub fn add_param(&mut self, name: Option<String>, ty: TensorType) -> Value {
        let idx = self.params.len();
        let v = self.values.push(ValueData { ty, def: ValueDef::Param(idx), name });
        self.params.push(v);
        v
    }

    /// Appends a node whose results have the given types; returns the node and its results.
    /// No checks: use [`crate::FunctionBuilder`] or run the verifier.
    pub fn push_node(&mut self, op: Op, inputs: Vec<Value>, result_types: Vec<TensorType>) -> (Node, Vec<Value>) {
        let node = self.nodes.next_key();
        let results: Vec<Value> = result_types
            .into_iter()
            .enumerate()
            .map(|(i, ty)| self.values.push(ValueData { ty, def: ValueDef::Result(node, i), name: None }))
            .collect();
        self.nodes.push(NodeData { op, inputs, results: results.clone() });
        (node, results)
    }

    /// Type of a value.
    pub fn ty(&self, v: Value) -> &TensorType {
        &self.values[v].ty
    }

    /// The printed label of a value: `%name` or `%v3`.
    pub fn label(&self, v: Value) -> String {
        match self.values.get(v).and_then(|d| d.name.as_ref()) {
            Some(n) => format!("%{n}"),
            None => format!("%{v}"),
        }
    }

    /// The parameter called `name`.
    pub fn param_named(&self, name: &str) -> Option<Value> {
        self.params.iter().copied().find(|&p| self.values[p].name.as_deref() == Some(name))
    }

    /// Renumbers values so that parameters come first, then node results in node order (the
    /// order the parser allocates them in), so that `parse(print(f)) == f` holds for functions
    /// whose parameters were declared between nodes.
    pub fn canonicalize(&mut self) {
        let mut order: Vec<Value> = self.params.clone();
        for nd in self.nodes.values() {
            order.extend(nd.results.iter().copied());
        }
        if order.iter().enumerate().all(|(i, v)| v.index() == i) && order.len() == self.values.len() {
            return;
        }
        let mut remap = std::collections::HashMap::new();
        let mut values = PrimaryMap::new();
        for &old in &order {
            let new = values.push(self.values[old].clone());
            remap.insert(old, new);
        }
        let map = |v: &Value| remap.get(v).copied().unwrap_or(*v);
        self.params = self.params.iter().map(map).collect();
        self.outputs = self.outputs.iter().map(map).collect();
        for nd in self.nodes.values_mut() {
            nd.inputs = nd.inputs.iter().map(map).collect();
            nd.results = nd.results.iter().map(map).collect();
        }
        self.values = values;
    }

    /// Parameter and output types.
    pub fn signature(&self) -> Signature {
        Signature {
            params: self.params.iter().map(|&p| self.values[p].ty.clone()).collect(),
            results: self.outputs.iter().map(|&o| self.values[o].ty.clone()).collect(),
        }
    }
}


/// A whole program: functions, one of which is the entry (`@main` by default, else the last).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    /// Functions in definition order; a callee is defined before its callers.
    pub funcs: PrimaryMap<FuncId, Function>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Adds a function.
    pub fn add_func(&mut self, f: Function) -> FuncId {
        self.funcs.push(f)
    }

    /// The function called `name`.
    pub fn func(&self, name: &str) -> Option<&Function> {
        self.funcs.values().find(|f| f.name == name)
    }

    /// Id of the function called `name`.
    pub fn func_id(&self, name: &str) -> Option<FuncId> {
        self.funcs.iter().find(|(_, f)| f.name == name).map(|(id, _)| id)
    }

    /// The entry function: `@main` if present, else the last one defined.
    pub fn entry(&self) -> Option<&Function> {
        self.func("main").or_else(|| self.funcs.values().last())
    }

    /// This graph with symbols fixed: every dim of every value type and every dim attribute of
    /// every function, with the symbols named in `values` replaced by their constants (e.g. a
    /// decode graph specialised to a batch of `T = 1`, so that the code generator can choose
    /// the flat GEMM for its projections). Symbols are per function but named alike across a
    /// model's functions (`T` of a layer is the caller's `T`), so all functions get the same
    /// substitution. The result should be verified ([`crate::verify`]): a value that made a
    /// shape rule hold only symbolically may not hold for the constant.
    pub fn specialize(&self, values: &std::collections::BTreeMap<String, i64>) -> Graph {
        let map: std::collections::BTreeMap<String, Dim> = values.iter().map(|(k, v)| (k.clone(), Dim::constant(*v))).collect();
        let mut g = self.clone();
        for f in g.funcs.values_mut() {
            for (_, vd) in f.values.iter_mut() {
                for d in vd.ty.shape.iter_mut() {
                    *d = d.substitute(&map);
                }
            }
            for (_, nd) in f.nodes.iter_mut() {
                for a in nd.op.attrs.iter_mut() {
                    match a {
                        crate::attr::Attr::Dims(v) => v.iter_mut().for_each(|d| *d = d.substitute(&map)),
                        crate::attr::Attr::Dim(d) => *d = d.substitute(&map),
                        _ => {}
                    }
                }
            }
        }
        g
    }
}
