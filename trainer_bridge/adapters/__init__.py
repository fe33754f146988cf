"""Adapters that hand the bridge's batches to other trainers in their own types: TRL
(`trl_adapter`), verl (`verl_adapter`), slime (`slime_adapter`) and Tinker (`tinker_adapter`).
Each imports its trainer only inside its module, so nothing else in Rollstream needs the trainer
installed. Every adapter acknowledges a batch (commits its offsets) only once its trainer has
taken it, as the bridge's own loop does.
"""
