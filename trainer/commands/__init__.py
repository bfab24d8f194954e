"""The `python -m trainer` commands that train and evaluate. They sit above everything
else in the trainer: the only modules that choose between one process and a placement
on Ray (`trainer.runtime`), and the ones that open a run's link (`run_link`)."""
