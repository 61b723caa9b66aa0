// NCCL backend (placeholder until it lands).
