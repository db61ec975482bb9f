//! Snapshots of a tiny plan: its `inspect` table and its JSON. Review a
//! changed .snap like code before accepting it.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::*;

fn tiny_mlp() -> Plan {
    plan(TINY_MLP, 2, &FsdpConfig::default()).unwrap()
}

#[test]
fn json_of_tiny_mlp() {
    let plan = tiny_mlp();
    let mut v = serde_json::to_value(&plan).unwrap();
    // The training program is the ir crate's to snapshot; keep the plan's own parts.
    if let Some(o) = v.as_object_mut() {
        o.remove("training");
    }
    insta::assert_json_snapshot!(v);
}
