// DistributedCheckpointManager::add(ParameterServerStrategy&) and the servers' checkpoint source: placeholder (issue 14).
