#!/usr/bin/env python3
"""Writes tests/golden/data/tensorboard_events.tfrecord, read by tests/monitor/test_metrics.cpp (TfrecordGolden).

TensorBoard's own writer makes it: its RecordWriter (TFRecord framing with its own CRC-32C) over Event protobufs
serialised by TensorBoard's protobuf classes, so nothing of kiln's encoding or checksum is involved. The events
(the C++ test builds the same three with kiln's tfrecord:: functions and compares the bytes):
  1. wall_time 1700000000.5, file_version "brain.Event:2"
  2. wall_time 1700000001.25, step 100, summary {loss: 0.25, lr: 0.001}
  3. wall_time 1700000002.0, step 7, session_log START

It also checks TensorBoard's CRC-32C on the RFC 3720 B.4 test vectors that the C++ test uses.

Run: PYTHONPATH=third_party/python python3 tests/golden/make_golden_tfrecord.py
     (scripts/setup.sh installs tensorboard into third_party/python)
"""
import io
import os

from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c
from tensorboard.summary.writer.record_writer import RecordWriter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "tensorboard_events.tfrecord")

RFC3720 = [  # (bytes, CRC-32C), RFC 3720 appendix B.4
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (bytes.fromhex("01c00000000000000000000000000000140000000000040000000014000000182800000000000000"
                   "0200000000000000"), 0xD9963A56),
]


def main():
    for data, want in RFC3720:
        got = crc32c(data) & 0xFFFFFFFF
        assert got == want, f"TensorBoard's crc32c of {data.hex()} is {got:#010x}, RFC 3720 says {want:#010x}"

    events = [
        event_pb2.Event(wall_time=1700000000.5, file_version="brain.Event:2"),
        event_pb2.Event(wall_time=1700000001.25, step=100, summary=summary_pb2.Summary(value=[
            summary_pb2.Summary.Value(tag="loss", simple_value=0.25),
            summary_pb2.Summary.Value(tag="lr", simple_value=0.001)])),
        event_pb2.Event(wall_time=1700000002.0, step=7,
                        session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START)),
    ]
    buffer = io.BytesIO()
    writer = RecordWriter(buffer)
    for e in events:
        writer.write(e.SerializeToString())
    with open(OUT, "wb") as f:
        f.write(buffer.getvalue())
    print(f"wrote {OUT} ({len(buffer.getvalue())} bytes)")


if __name__ == "__main__":
    main()
