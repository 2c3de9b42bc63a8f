"""The natural-text study: every variant trained from scratch on the same tokens, analysed
on held-out text (the main job's last part, and ``--study text``).

- ``config``: ``TextConfig``, the study's settings (the lr and rank studies extend it);
- ``plan``: the budget planner (steps fitted to the wall-clock budget from timed steps,
  stepping down the model or the seeds, the compile decision);
- ``results``: ``TextResults``, the keys the study writes at the top level of its
  ``results.json``;
- ``run``: one training run, its analysis, the per-variant summaries, and the study's
  start and provenance.
"""
