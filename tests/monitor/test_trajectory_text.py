"""Monitoring text: a trajectory rendered for TensorBoard (sampled spans told from context by the loss
mask), a few per task logged, and the resolved config as text at step 0, read back from the event file."""
from __future__ import annotations

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentrl.config import RunConfig
from agentrl.monitor.tensorboard import Monitor, config_text, write_config
from agentrl.monitor.trajectory_text import pick_per_task, render_trajectory, spans, write_conversations
from agentrl.types import TrajectoryBuilder

VOCAB = {1: "<user>find x</user>", 2: '<tool_call>{"name": "get", "arguments": {"k": "x"}}</tool_call>',
         3: "<tool>x=7</tool>", 4: '<tool_call>{"name": "submit", "arguments": {"v": 7}}</tool_call>'}


class Decoder:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(VOCAB[i] for i in ids)


def episode(task="lookup", status="completed", reward=1.0):
    b = TrajectoryBuilder()
    b.add_context([1])
    b.add_action([2], [-0.5], version=3, engine=0)
    b.add_context([3])
    b.add_action([4, 4], [-0.1, -0.2], version=4, engine=1000)
    return b.build(traj_id=f"id-{task}-{status}", task=task, index="7", group_id="g1", reward=reward,
                   status=status, num_turns=2, metrics={"success": reward})


def test_render_tells_sampled_from_context():
    t = episode()
    assert [(s, ids.tolist(), v, e) for s, ids, v, e in spans(t)] == [
        (False, [1], -1, -1), (True, [2], 3, 0), (False, [3], -1, -1), (True, [4, 4], 4, 1000)]
    text = render_trajectory(t, Decoder())
    lines = text.splitlines()
    assert lines[0] == "**lookup** sample `7` (group `g1`, id `id-lookup-completed`)"
    assert "*context, 1 tokens:*" in lines and "*policy v3, engine 0, 1 tokens:*" in lines
    assert "*policy v4, engine 1000, 2 tokens:*" in lines
    assert '    <tool_call>{"name": "get", "arguments": {"k": "x"}}</tool_call>' in lines
    assert "    <tool>x=7</tool>" in lines
    assert lines[-1] == "**ended**: status `completed`, reward 1, 2 turns, 5 tokens (3 sampled); success=1"
    assert text.index("find x") < text.index('"get"') < text.index("x=7") < text.index('"submit"')


def test_pick_per_task_mixes_endings():
    trajs = [episode("a"), episode("a"), episode("a", "turn_limit", 0.0), episode("b", "env_error", 0.0)]
    picked = pick_per_task(trajs, 2)
    assert [t.status.value for t in picked["a"]] == ["completed", "turn_limit"]
    assert [t.status.value for t in picked["b"]] == ["env_error"]


class Recorder:
    def __init__(self):
        self.texts = []

    def text(self, tag, value, step=0):
        self.texts.append((tag, value, step))


def test_write_conversations_and_config_to_tensorboard(tmp_path):
    rec = Recorder()
    logged = write_conversations(rec, [episode("a"), episode("b")], Decoder(), step=5, per_task=1)
    assert [(tag, step) for tag, _, step in rec.texts] == [("conversations/a/0", 5), ("conversations/b/0", 5)]
    assert logged["conversations/a/0"] == rec.texts[0][1]

    cfg = RunConfig()
    mon = Monitor(tmp_path / "tb", "trainer")
    write_config(mon, cfg)
    mon.close()
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(files[0]), size_guidance={"tensors": 0})
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert any(t.startswith("config") for t in tags)
    (event,) = acc.Tensors(next(t for t in tags if t.startswith("config")))
    assert event.step == 0
    stored = np.asarray(event.tensor_proto.string_val[0]).item().decode()
    assert stored == config_text(cfg)
    assert "    trainer:" in stored and f"      lr: {cfg.trainer.lr}" in stored
