"""The CAST pipeline: stages from trajectories to a critique-trained policy, resumable by stage."""
