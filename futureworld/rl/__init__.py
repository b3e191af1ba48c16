"""Replay-and-train: turn scored rollouts of older policy versions into the next version.

config (TrainConfig), advantages (estimator registry), batch (packing, chunked log-probs),
losses (decoupled PPO, SFT), trainer (train_policy, train_sft), checkpoints (atomic saves).
"""
