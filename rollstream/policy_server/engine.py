"""The embedded server's engine: continuous batching over the tiny model, and weight reloads that
never mix versions within a request.

One engine task owns the decode batch; requests queue up, join it between steps and leave when
finished, and each step (prefill of joiners + one token for every row) runs in a worker thread so
the event loop keeps serving. A reload stops admitting requests, lets the running ones finish on
the old weights, swaps, then resumes (vLLM's `/pause?mode=wait`, reload, `/resume`); requests
arriving meanwhile wait in the queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from rollstream.policy_server.model import DecodeBatch, Sequence, TinyLM, load

log = logging.getLogger(__name__)


class Engine:
    """Owns the model and the decode batch; the only mutator of both is its loop task."""

    def __init__(self, model: TinyLM, version: int, max_batch: int, seed: int) -> None:
        self.batch = DecodeBatch(model, seed=seed)
        self.policy_version = version
        self.max_batch = max_batch
        self.waiting: deque[Sequence] = deque()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._futures: dict[Sequence, asyncio.Future[int]] = {}
        self._wake = asyncio.Event()
        self._swap: tuple[TinyLM, int, asyncio.Future[None]] | None = None
        self._reload_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def model(self) -> TinyLM:
        return self.batch.model

    @property
    def max_model_len(self) -> int:
        return self.model.config.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="policy-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def generate(self, seq: Sequence) -> int:
        """Queue `seq`, wait until it finishes; returns the policy version that generated it."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._futures[seq] = future
        self.waiting.append(seq)
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            seq.aborted = True  # the client went away: free its batch row at the next step
            raise

    async def load_weights(self, path: str, version: int | None) -> int:
        model, file_version = await asyncio.to_thread(load, path)
        version = file_version if version is None else version
        async with self._reload_lock:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._swap = (model, version, done)
            self._wake.set()
            await done
        return version

    async def _run(self) -> None:
        while True:
            if self._swap is not None and not self.batch:
                model, version, done = self._swap
                self._swap = None
                self.batch.model, self.policy_version = model, version
                log.info("policy version %d loaded", version)
                if not done.done():
                    done.set_result(None)
            admit: list[Sequence] = []
            # While a reload waits, admit nothing: the running batch drains on the old weights.
            free = self.max_batch - len(self.batch)
            while self._swap is None and self.waiting and len(admit) < free:
                seq = self.waiting.popleft()
                if seq.aborted:
                    self._futures.pop(seq, None)
                else:
                    admit.append(seq)
            if not admit and not self.batch:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                finished, refused = await asyncio.to_thread(self._step, admit)
            except Exception as exc:  # a bug must fail its requests, not hang them
                log.exception("decode step failed")
                for seq in [*self.batch.seqs, *admit]:
                    self._finish(seq, exc)
                self.batch.clear()
                continue
            for seq, exc in refused:
                self._finish(seq, exc)
            joined = [s for s in admit if all(s is not r for r, _ in refused)]
            self.prompt_tokens_total += sum(len(s.prompt_ids) for s in joined)
            self.generation_tokens_total += len(self.batch) + len(finished)
            for seq in finished:
                self._finish(seq, None)

    def _step(self, admit: list[Sequence]
              ) -> tuple[list[Sequence], list[tuple[Sequence, Exception]]]:
        """Admit, then decode one token for every row: (finished, refused with why). A
        request that cannot join the batch fails alone; the others join without it."""
        refused: list[tuple[Sequence, Exception]] = []
        if admit:
            try:
                self.batch.add(admit)  # all or nothing: the batch is unchanged if it raises
            except Exception:
                for seq in admit:
                    try:
                        self.batch.add([seq])
                    except Exception as exc:
                        log.warning("request refused at admission: %s", exc)
                        refused.append((seq, exc))
        return self.batch.step(), refused

    def _finish(self, seq: Sequence, exc: Exception | None) -> None:
        future = self._futures.pop(seq, None)
        if future is None or future.done():
            return
        if exc is None:
            future.set_result(self.policy_version)
        else:
            future.set_exception(exc)
