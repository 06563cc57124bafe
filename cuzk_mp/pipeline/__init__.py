"""The multiprocess proving pipeline: slot ring, synthesis workers, prover processes, engine.

Data flow (DESIGN.md section 1): the :class:`~cuzk_mp.pipeline.engine.Engine`
queues partitions (priority, then FIFO) and hands them to synthesis worker
processes (:mod:`.synth`), which write a, b, c, w into shared-memory slots of
the ring (:mod:`.ring`); prover processes (:mod:`.prover_proc`, one per
device) take ready slots, stage, prove and finalize, and send the proofs back.
"""
