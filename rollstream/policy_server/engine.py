"""The embedded server's engine: continuous batching over the tiny model, and weight reloads that
never mix versions within a request.

One engine task owns the decode batches; requests queue up, join a batch between steps and
leave when finished, and each step (prefill of joiners + one token for every row) runs in a
worker thread so the event loop keeps serving. A reload stops admitting requests, lets the
running ones finish on the old weights, swaps, then resumes (vLLM's `/pause?mode=wait`, reload,
`/resume`); requests arriving meanwhile wait in the queue.

Adapters: besides its own weights (`BASE`) the engine holds named weight sets, one decode batch
each, which requests choose by name (vLLM's LoRA adapters, `model: <name>`). An adapter of the
tiny model is a whole checkpoint of it, not a low-rank delta. Loading one in place, or
unloading it, drains that adapter's batch alone: the other adapters' requests go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from rollstream.contracts.wire import split_lora
from rollstream.policy_server.model import DecodeBatch, Sequence, TinyLM, load

log = logging.getLogger(__name__)

BASE = ""  # the engine's own weights, as opposed to a named adapter


class AdapterGone(LookupError):
    """A request's adapter was unloaded while it waited."""


class Engine:
    """Owns the models and their decode batches; the only mutator of them is its loop task."""

    def __init__(self, model: TinyLM, version: int, max_batch: int, seed: int) -> None:
        self.seed = seed
        self.batches: dict[str, DecodeBatch] = {BASE: DecodeBatch(model, seed=seed)}
        self.versions: dict[str, int] = {BASE: version}
        self.adapters: dict[str, str] = {}  # adapter name -> the path it was loaded from
        self.max_batch = max_batch
        self.waiting: deque[Sequence] = deque()
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self._futures: dict[Sequence, asyncio.Future[int]] = {}
        self._wake = asyncio.Event()
        # Per weight set, the swap waiting for its batch to drain: (model, version, path, done);
        # model None: unload.
        self._swaps: dict[str, tuple[TinyLM | None, int, str, asyncio.Future[None]]] = {}
        self._reload_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    @property
    def model(self) -> TinyLM:
        return self.batches[BASE].model

    @property
    def policy_version(self) -> int:
        return self.versions[BASE]

    @property
    def running(self) -> int:
        return sum(len(b) for b in self.batches.values())

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
        """Queue `seq`, wait until it finishes; returns the policy version that generated it
        (of `seq.adapter`'s weights)."""
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
        await self._swap(BASE, model, version, path)
        return version

    async def load_adapter(self, name: str, path: str) -> int:
        """Load the checkpoint at `path` as adapter `name` (in place if it exists). Its version
        is the one its name carries (`<adapter>-v<N>`), else the checkpoint's own."""
        model, file_version = await asyncio.to_thread(load, path)
        own = self.model.config
        if (model.config.vocab_size, model.config.max_model_len) != (
                own.vocab_size, own.max_model_len):
            raise ValueError(f"{path} is not a weight set of this server's model (vocabulary "
                             f"or context length differs)")
        named = split_lora(name)
        version = named[1] if named is not None else file_version
        await self._swap(name, model, version, path)
        return version

    async def unload_adapter(self, name: str) -> None:
        """Unload adapter `name` once its running requests finish; its waiting ones fail."""
        await self._swap(name, None, 0, "")

    async def _swap(self, name: str, model: TinyLM | None, version: int, path: str) -> None:
        async with self._reload_lock:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._swaps[name] = (model, version, path, done)
            self._wake.set()
            await done

    def _apply_swaps(self) -> None:
        """Swap in (or out) every weight set whose batch has drained."""
        for name, (model, version, path, done) in list(self._swaps.items()):
            batch = self.batches.get(name)
            if batch is not None and batch:
                continue
            del self._swaps[name]
            if model is None:
                self.batches.pop(name, None)
                self.versions.pop(name, None)
                self.adapters.pop(name, None)
                log.info("adapter %s unloaded", name)
            else:
                if batch is None:
                    self.batches[name] = DecodeBatch(model, seed=self.seed)
                batch = self.batches[name]
                batch.model, self.versions[name] = model, version
                if name != BASE:
                    self.adapters[name] = path
                log.info("policy version %d loaded%s", version, f" as {name}" if name else "")
            if not done.done():
                done.set_result(None)

    async def _run(self) -> None:
        while True:
            self._apply_swaps()
            admit: dict[str, list[Sequence]] = {}
            held: list[Sequence] = []
            # While a weight set's reload waits, admit nothing to it: its running batch drains
            # on the old weights. The other weight sets' requests go on.
            free = self.max_batch - self.running
            admitted = 0
            while self.waiting and admitted < free:
                seq = self.waiting.popleft()
                if seq.aborted:
                    self._futures.pop(seq, None)
                elif seq.adapter in self._swaps:
                    held.append(seq)
                elif seq.adapter not in self.batches:
                    self._finish(seq, AdapterGone(seq.adapter))
                else:
                    admit.setdefault(seq.adapter, []).append(seq)
                    admitted += 1
            self.waiting.extendleft(reversed(held))
            if not admit and not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                finished, refused = await asyncio.to_thread(self._step, admit)
            except Exception as exc:  # a bug must fail its requests, not hang them
                log.exception("decode step failed")
                for batch in self.batches.values():
                    for seq in batch.seqs:
                        self._finish(seq, exc)
                    batch.clear()
                for seqs in admit.values():
                    for seq in seqs:
                        self._finish(seq, exc)
                continue
            for seq, exc in refused:
                self._finish(seq, exc)
            joined = [s for seqs in admit.values() for s in seqs
                      if all(s is not r for r, _ in refused)]
            self.prompt_tokens_total += sum(len(s.prompt_ids) for s in joined)
            self.generation_tokens_total += self.running + len(finished)
            for seq in finished:
                self._finish(seq, None)

    def _step(self, admit: dict[str, list[Sequence]]
              ) -> tuple[list[Sequence], list[tuple[Sequence, Exception]]]:
        """Admit, then decode one token for every row of every batch: (finished, refused with
        why). A request that cannot join a batch fails alone; the others join without it."""
        refused: list[tuple[Sequence, Exception]] = []
        for name, seqs in admit.items():
            batch = self.batches[name]
            try:
                batch.add(seqs)  # all or nothing: the batch is unchanged if it raises
            except Exception:
                for seq in seqs:
                    try:
                        batch.add([seq])
                    except Exception as exc:
                        log.warning("request refused at admission: %s", exc)
                        refused.append((seq, exc))
        return [seq for batch in self.batches.values() for seq in batch.step()], refused

    def _finish(self, seq: Sequence, exc: Exception | None) -> None:
        future = self._futures.pop(seq, None)
        if future is None or future.done():
            return
        if exc is None:
            future.set_result(self.versions[seq.adapter])
        else:
            future.set_exception(exc)
