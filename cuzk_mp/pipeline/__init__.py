"""The multiprocess proving pipeline: slot ring, synthesis workers, prover processes, engine.

Data flow (docs/architecture.md): :class:`~cuzk_mp.pipeline.engine.Engine` starts a
:class:`~cuzk_mp.pipeline.engine.RunningEngine`, which queues partitions (priority,
then FIFO) and hands them to synthesis worker processes (:mod:`.synth`); each takes a
free slot of the ring (:mod:`.ring`) and synthesises w, a, b, c straight into it;
prover processes (:mod:`.prover_proc`, one per device) take ready slots, stage,
prove and finalize, and send the proofs back.
"""
