"""Drafters small enough to ship inside vspec (data package ``vspec_drafters``).

smollm2-eagle3/: an EAGLE-3 head with an 8,192-token draft vocabulary for the CPU demo's
SmolLM2-135M-Instruct, trained in two GPU runs by training/gpu_pipeline.py (the `demo-eagle` preset's).
smollm2-eagle/: the earlier EAGLE-1 head for the same target, trained on a 2-core CPU by
training/train_eagle.py. Each manifest.json says with what data, steps and losses (docs/training.md).
"""
