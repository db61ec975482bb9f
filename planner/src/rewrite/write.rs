//! The chosen form written into its instruction: the dtype on the wire,
//! the `CollectiveAlgorithm`, and the stream's `Staging` buffer where the
//! form needs one (made on first use, grown to the stream's largest).

use super::choose::{Form, Site};
use fsdpc_ir::DType;
use fsdpc_plan::{
    hier_gather_staging_bytes, hier_reduce_staging_bytes, Buffer, BufferId, BufferKind, Collective,
    CollectiveAlgorithm, InstrOp,
};

/// The streams' staging buffers (`BufferKind::Staging`), made on first
/// use and grown to the most any collective of the stream needs.
#[derive(Default)]
pub(super) struct Stagings(Vec<(fsdpc_plan::Stream, BufferId)>);

impl Stagings {
    pub(super) fn need(
        &mut self,
        buffers: &mut Vec<Buffer>,
        stream: fsdpc_plan::Stream,
        bytes: u64,
    ) -> BufferId {
        let id = match self.0.iter().find(|(s, _)| *s == stream) {
            Some(&(_, id)) => id,
            None => {
                let id = Buffer::add(buffers, BufferKind::Staging, DType::Bool, 0)
                    .on_stream(stream)
                    .id;
                self.0.push((stream, id));
                id
            }
        };
        let b = &mut buffers[id.index()];
        b.bytes = b.bytes.max(bytes);
        id
    }
}

/// Writes `form` into the instruction, with the stream's staging buffer
/// (`staging(bytes)`) where the form needs one.
pub(super) fn write_back(
    op: &mut InstrOp,
    site: &Site,
    form: &Form,
    f: u32,
    staging: &mut dyn FnMut(u64) -> BufferId,
) {
    match op {
        InstrOp::AllGather {
            c:
                Collective {
                    dtype,
                    algorithm,
                    staging: st,
                    ..
                },
            ..
        } => {
            // Without the cast the shard moves in its own dtype.
            *dtype = if form.cast_first { site.to } else { site.from };
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::Hierarchical {
                *st = Some(staging(hier_gather_staging_bytes(
                    site.numel, site.m, site.to,
                )));
            }
        }
        InstrOp::ReduceScatter {
            c:
                Collective {
                    algorithm,
                    staging: st,
                    ..
                },
        } => {
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::Hierarchical {
                let shard = site.numel / u64::from(f.max(1));
                *st = Some(staging(hier_reduce_staging_bytes(shard, site.m)));
            }
        }
        InstrOp::AllReduce {
            algorithm,
            staging: st,
            ..
        } => {
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::ReduceScatterAllGather {
                let n = u64::from((site.k * site.m).max(1));
                *st = Some(staging(site.numel / n * site.from.size() as u64));
            }
        }
        _ => {}
    }
}
