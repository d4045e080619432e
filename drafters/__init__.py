"""Drafters small enough to ship inside vspec (data package ``vspec_drafters``).

smollm2-eagle/: an EAGLE-1 head for the CPU demo's SmolLM2-135M-Instruct, trained on a 2-core CPU by
training/train_eagle.py; manifest.json says with what data, steps and losses.
"""
