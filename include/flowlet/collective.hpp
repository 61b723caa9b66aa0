// Processes and collectives: the job's processes (from the launcher) and the collective ops.
//
// A program started by a launcher (`mpirun -np N prog`, `srun prog`) is one of N processes; started
// plainly, it is the only one and needs no launcher. Collectives are ops like any other: eager or
// traced, with gradients. Inside MirroredStrategy::run they span every replica (local devices x
// processes); elsewhere they span the processes, one participant each (its default device).
//
// Example (every process runs this):
//   Tensor local_loss = ...;
//   Tensor mean_loss = all_reduce(local_loss, ReduceOp::mean);   // same value on every process
//
// Participants that disagree (a different collective, shape, dtype, reduction or root) get an
// Error on every participant, never a hang; a collective whose peers do not all arrive within the
// limit (FLOWLET_COLLECTIVE_TIMEOUT seconds, default 300) throws DeadlineExceeded naming the
// collective and the ranks that did not arrive.
#pragma once

#include <cstdint>

#include "flowlet/core/tensor.hpp"

namespace flowlet {

// This process's index in the job (0 .. process_count() - 1) and the job's size: from the launcher
// (Open MPI, Slurm), 0 and 1 for a plain run.
int process_index();
int process_count();
// This process's index among the job's processes on the same machine: its default GPU is
// cuda:<local_process_index()> when it has GPUs.
int local_process_index();

enum class ReduceOp : uint8_t { sum, mean, max, min };
const char* to_string(ReduceOp op);  // "sum", "mean", "max", "min"

// The element-wise reduction of `t` over every participant, on each participant. Every dtype;
// mean divides in the tensor's dtype (integers truncate toward zero).
Tensor all_reduce(const Tensor& t, ReduceOp op = ReduceOp::sum);
// Participant `root`'s value on every participant (each passes a tensor of the same shape and dtype).
Tensor broadcast(const Tensor& t, int root = 0);
// Every participant's `t` concatenated along axis 0, in participant order (rank 0 scalars become
// shape [participants]).
Tensor all_gather(const Tensor& t);
// The reduction of `t` over every participant, split along axis 0 into equal parts: participant i
// gets part i. Axis 0 must divide by the number of participants.
Tensor reduce_scatter(const Tensor& t, ReduceOp op = ReduceOp::sum);
// Returns once every participant has called it.
void barrier();

}  // namespace flowlet
