# Checkpoints written by training: resume, resharding, kills, preemption.
