"""What `python -m qml_ray.serve` runs on Ray Serve: an HTTP endpoint, and the replicas that hold the model.

`Endpoint` (no TensorFlow in it) answers HTTP: it reads a request's rows with the same column-to-input
rules as training and `infer` (features.py), each input a key of the row, a circuit the base64 of
its serialized form, and hands them to a `ModelReplica`, which checks the circuits and answers
every request of a batch (`@serve.batch`) with one call of the model. A replica that dies while it
holds a request is replaced by Serve; the endpoint sends the request again, to another replica or
the replacement, so no accepted request goes unanswered. A bad request is answered 400 (a body too
large: 413, Content Too Large, so a client can tell "send fewer rows" from "fix the rows") with one
line, `{"error": "..."}`, and never reaches the model.
"""

import asyncio
import base64
import binascii
import dataclasses
import json

import numpy as np
import pyarrow as pa
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import ReplicaUnavailableError

from qml_ray import datasets, features
from qml_ray.errors import UsageError, one_line

ATTEMPTS = 3  # times the endpoint sends a request to the model's replicas, the first time and after replicas died
HEALTH_SECONDS = 5  # the longest /healthz waits for a replica to answer
PREDICT = "/predict"
REQUEST = '{"rows": [{INPUT: VALUE, ...}, ...]}'


class BadRequest(UsageError):
    """A request the endpoint refuses, with its HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def rows_table(request) -> pa.Table:
    """A request's rows as a table, a column per key any row gives, or a BadRequest."""
    rows = request.get("rows") if isinstance(request, dict) else None
    if not isinstance(rows, list) or not rows or not all(isinstance(row, dict) for row in rows):
        raise BadRequest(f"the body must be {REQUEST}, with at least one row")
    keys = dict.fromkeys(key for row in rows for key in row)
    try:
        table = pa.table({key: [row.get(key) for row in rows] for key in keys})
    except (pa.ArrowException, TypeError, ValueError) as err:
        raise BadRequest(f"each key must take values of one kind in every row: {one_line(err)}") from None
    for name in table.column_names:
        if table.column(name).null_count:
            row = table.column(name).is_null().to_pylist().index(True)
            raise BadRequest(f"rows[{row}] has no value for {name!r}")
    return table


def columns_of(table: pa.Table) -> tuple[features.Column, ...]:
    """The table's columns as features describes a data set's, a list's length among them."""
    return tuple(
        dataclasses.replace(column, width=features.list_width(table, column.name))
        if column.kind == features.NUMBERS
        else column
        for column in features.columns_of(table.schema)
    )


def model_inputs_of(request, inputs: tuple[features.ModelInput, ...]) -> dict[str, np.ndarray]:
    """The request's rows (dicts of a value per input) as the model's inputs take them, by input name;
    circuits given as text are base64 (what JSON carries), as bytes serialized; a BadRequest for what
    does not fit."""
    table = rows_table(request)
    try:
        feed = features.feed(inputs, columns_of(table), "the request")
        by_input = feed.by_input(datasets.numpy_columns(table, feed.columns))
    except UsageError as err:
        raise BadRequest(str(err)) from None
    for model_input, column in feed.pairs:
        if model_input.takes_circuits:
            values = by_input[model_input.name]
            by_input[model_input.name] = np.array(
                [serialized(value, row, column.name) for row, value in enumerate(values)], dtype=object
            )
    return by_input


def serialized(circuit, row: int, key: str) -> bytes:
    """A circuit's serialized bytes, from the base64 text of them (or the bytes themselves)."""
    if isinstance(circuit, bytes):
        return circuit
    try:
        return base64.b64decode(circuit, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest(f"rows[{row}].{key} is not base64 (a circuit is the base64 of its serialized form)") from None


def description(inputs: tuple[features.ModelInput, ...], outputs: int, qubits: list) -> dict:
    """What GET / answers: the request's form, the key and value of each input, the answer's form."""

    def takes(model_input: features.ModelInput) -> str:
        if model_input.takes_circuits:
            on = f" on {len(qubits)} qubits, {qubits[0]}..{qubits[-1]}" if qubits else ""
            return f"a circuit{on}: the base64 of its serialized form (tfq.convert_to_tensor)"
        values = int(np.prod(model_input.shape, dtype=int))
        return "a number" if values == 1 else f"a list of {values} numbers"

    single_circuit = len(inputs) == 1 and inputs[0].takes_circuits
    keys = [features.CIRCUIT if single_circuit else model_input.name for model_input in inputs]
    return {
        "request": f"POST {PREDICT} {REQUEST}",
        "inputs": {key: takes(model_input) for key, model_input in zip(keys, inputs)},
        "answer": '{"predictions": [[...], ...]}, ' + f"{outputs} value(s) per row, in the rows' order",
    }


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Endpoint:
    """The HTTP endpoint: GET / (what a request gives), GET /healthz, POST /predict."""

    def __init__(self, model, max_body_bytes: int):
        self.model = model  # the ModelReplica deployment's handle
        self.max_body_bytes = max_body_bytes
        self.shape = None  # the model's inputs and description, asked of a replica once

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        try:
            status, answer = 200, await self.route(request)
        except BadRequest as err:
            status, answer = err.status, {"error": one_line(err)}
        except Exception as err:  # the model's failure, after every attempt: one line, the endpoint stays up
            status, answer = 500, {"error": one_line(f"{type(err).__name__}: {err}")}
        return JSONResponse(answer, status)

    async def route(self, request) -> dict:
        route = request.method, request.url.path
        if route == ("GET", "/"):
            return (await self.model_shape())["description"]
        if route == ("GET", "/healthz"):
            return await self.health()
        if route == ("POST", PREDICT):
            return await self.predict(await self.body(request))
        raise BadRequest(f"no {request.method} {request.url.path}: GET /, GET /healthz or POST {PREDICT}", 404)

    async def body(self, request):
        """The request's JSON body, of at most max_body_bytes."""
        limit = f"the body is larger than the {self.max_body_bytes / 2**20:.3g} MB a request may have: send fewer rows"
        if int(request.headers.get("content-length") or 0) > self.max_body_bytes:
            raise BadRequest(limit, 413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > self.max_body_bytes:
                raise BadRequest(limit, 413)
        try:
            return json.loads(body)
        except ValueError as err:
            raise BadRequest(f"the body is not JSON: {one_line(err)}") from None

    async def predict(self, request) -> dict:
        """The predictions for the request's rows (dicts, as JSON or Python gives them), in their order."""
        by_input = model_inputs_of(request, (await self.model_shape())["inputs"])
        for attempt in range(1, ATTEMPTS + 1):
            try:
                answer = await self.model.predict.remote(by_input)
                break
            except (RayActorError, ReplicaUnavailableError):  # the replica died: Serve replaces it
                if attempt == ATTEMPTS:
                    raise
        if "error" in answer:
            raise BadRequest(answer["error"])
        return answer

    async def answer(self, request: dict) -> dict:
        """`predict`'s answer or {"error": ...}: what `qml_ray.serve`'s handle asks for."""
        try:
            return await self.predict(request)
        except BadRequest as err:
            return {"error": one_line(err)}

    async def health(self) -> dict:
        try:
            await asyncio.wait_for(self.model_shape(), HEALTH_SECONDS)
        except Exception:  # no replica answered
            raise BadRequest("the model is not loaded yet", 503) from None
        return {"status": "ok"}

    async def model_shape(self) -> dict:
        if self.shape is None:
            self.shape = await self.model.shape.remote()
        return self.shape


@serve.deployment
class ModelReplica:
    """The run's model with its final weights; each batch of requests one call of the model. The model
    function comes pickled by value (contract.pickled), so that a replica needs no import of the user's module."""

    def __init__(self, run: str, model_function: bytes, batch_size: int, batch_wait: float):
        from qml_ray import config as config_lib, contract, infer, replica, worker_setup

        with worker_setup.collector_paused():
            built = replica.build(config_lib.of_run(run), contract.unpickled(model_function))
            self.model = infer.with_weights(built, run)
        self.qubits = infer.model_qubits(self.model)
        self.inputs = features.model_inputs(self.model)
        self.outputs = (self.model.output_shape[1:] or (1,))[0]
        self.batched.set_max_batch_size(batch_size)
        self.batched.set_batch_wait_timeout_s(batch_wait)

    def shape(self) -> dict:
        """The model's inputs, and what GET / says of them."""
        return {"inputs": self.inputs, "description": description(self.inputs, self.outputs, self.qubits)}

    async def predict(self, by_input: dict[str, np.ndarray]) -> dict:
        """{"predictions": [[...], ...]} for the rows, or {"error": ...} naming the first circuit the model
        cannot take."""
        from qml_ray import infer

        for model_input in self.inputs:
            if model_input.takes_circuits:
                for row, circuit in enumerate(by_input[model_input.name]):
                    if problem := infer.circuit_problem(circuit, self.qubits):
                        return {"error": f"rows[{row}].{model_input.name} is {problem}"}
        return {"predictions": await self.batched(by_input)}

    @serve.batch
    async def batched(self, requests: list[dict]) -> list[list]:
        """Every request's predictions, from one call of the model on all their rows."""
        sizes = [len(next(iter(request.values()))) for request in requests]
        joined = {name: np.concatenate([request[name] for request in requests]) for name in requests[0]}
        predictions = await asyncio.to_thread(self.call_model, joined)
        return [part.tolist() for part in np.split(predictions, np.cumsum(sizes)[:-1])]

    def call_model(self, by_input: dict[str, np.ndarray]) -> np.ndarray:
        rows = len(next(iter(by_input.values())))
        return self.model(features.as_keras_takes(by_input), training=False).numpy().reshape(rows, self.outputs)
