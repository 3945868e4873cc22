"""How jobs come in: the one door (`service.submit`) and the jobs a training job's
`eval_after` makes through it (`eval_after`)."""
