"""TensorBoard: event files written with tensorboard's own writer and protos (no TensorFlow, no
torch). One log dir per run under one root per experiment, so `tensorboard --logdir <root>` shows a
sweep's members side by side."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.plugins.text import metadata as text_metadata
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    return struct.unpack(">II", data[16:24])


class TensorBoardBackend:
    name = "tensorboard"

    def __init__(self, log_dir: Path, identity):
        log_dir.mkdir(parents=True, exist_ok=True)
        self.writer = EventFileWriter(str(log_dir), flush_secs=10)
        self.where = f"`tensorboard --logdir {log_dir.parent}`"
        settings = "\n".join(f"{key}: {value}" for key, value in sorted(identity.params.items()))
        self.text(0, "config", f"```\n{settings}\n```")

    def _write(self, step: int, values: list) -> None:
        summary = summary_pb2.Summary(value=values)
        self.writer.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._write(step, [summary_pb2.Summary.Value(tag=tag, simple_value=value)
                           for tag, value in values.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        tensor = tensor_util.make_tensor_proto([text.encode()], shape=[1])
        metadata = text_metadata.create_summary_metadata(display_name=tag, description="")
        self._write(step, [summary_pb2.Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])

    def figures(self, paths: list[Path]) -> None:
        values = []
        for path in paths:
            data = path.read_bytes()
            width, height = png_size(data)
            image = summary_pb2.Summary.Image(height=height, width=width, colorspace=4,
                                              encoded_image_string=data)
            values.append(summary_pb2.Summary.Value(tag=f"figures/{path.stem}", image=image))
        self._write(0, values)

    def close(self, status: str) -> None:
        self.writer.close()
