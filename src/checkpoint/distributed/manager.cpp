// DistributedCheckpointManager: placeholder, filled by the checkpoint-core part (issue 14).
