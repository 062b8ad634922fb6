"""The CLI wing: what `python -m tnet.train` runs.

`flags.py` defines the flags and is the only module that reads them: the
entry point (tnet/train.py -> `main.main`) parses them once into a
`config.JobConfig`, and everything below receives that dataclass as an
argument: `main.run` checks it and picks the job, `train.train` (one fit,
then evaluation, summary and export), `daily.run_days` (--days),
`stream.run_stream` (--stream); `model.build_model` builds the model and
the callbacks of the lifecycle and publishing flags; `data` reads the
job's files; `export` exports and checks the SavedModel without tnet.

Only the entry module (tnet/train.py) imports it; it may import the rest
of tnet, which never imports it (so `import tnet` reads no flags).
"""
