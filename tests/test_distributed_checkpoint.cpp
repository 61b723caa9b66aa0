// Tests of DistributedCheckpointManager in one process: placeholder (issue 14).
