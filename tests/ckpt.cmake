# meshlm ckpt: the post-hoc tools on checkpoints (inspect, stats, diff,
# verify, export, import), checked against h5py and PyTorch.
