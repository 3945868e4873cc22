"""The end of an attempt: the lifecycle policy (facts in, next state out), its application to the
job's row, gangs of nodes, the retry budget."""
