"""Prompt formats of the agent service: parsing model replies into gym actions, and bounded prompts."""

from __future__ import annotations

import json

import pytest

from cua_rl.local_agent.actions import InvalidAction
from cua_rl.local_agent.formats import HistoryStep, PromptContext, format_names, get_format


def call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def qwen(**arguments) -> str:
    return call("computer_use", **arguments)


def mai(**arguments) -> str:
    return "<thinking>\nplan\n</thinking>\n" + call("mobile_use", **arguments)


def parse(agent: str, content: str, space: str = "pc", pointer=None):
    ctx = PromptContext(instruction="t", space=space, screen=(1280, 800), pointer=pointer)
    return get_format(agent).parse({"role": "assistant", "content": content}, ctx)


def test_registry_lists_both_formats_and_rejects_unknown():
    assert {"qwen3-vl", "mai-ui", "keyboard"} <= set(format_names())
    with pytest.raises(ValueError, match="unknown agent 'nope'"):
        get_format("nope")


@pytest.mark.parametrize("action,expected", [
    ("left_click", {"type": "click", "x": 0.25, "y": 0.75, "button": "left", "count": 1}),
    ("right_click", {"type": "click", "x": 0.25, "y": 0.75, "button": "right", "count": 1}),
    ("middle_click", {"type": "click", "x": 0.25, "y": 0.75, "button": "middle", "count": 1}),
    ("double_click", {"type": "click", "x": 0.25, "y": 0.75, "button": "left", "count": 2}),
    ("triple_click", {"type": "click", "x": 0.25, "y": 0.75, "button": "left", "count": 3}),
    ("mouse_move", {"type": "move", "x": 0.25, "y": 0.75}),
])
def test_qwen_mouse_actions_map_the_1000_grid_to_fractions(action, expected):
    turn = parse("qwen3-vl", qwen(action=action, coordinate=[250, 750]))
    assert [a.gym_action for a in turn.actions] == [expected]
    assert turn.actions[0].pointer == (0.25, 0.75)


def test_qwen_keyboard_scroll_wait():
    assert parse("qwen3-vl", qwen(action="key", keys=["Ctrl", "s"])).actions[0].gym_action == \
        {"type": "key", "keys": ["ctrl", "s"]}
    assert parse("qwen3-vl", qwen(action="type", text="héllo\n")).actions[0].gym_action == \
        {"type": "type", "text": "héllo\n"}
    # positive pixels scroll up = negative wheel notches
    assert parse("qwen3-vl", qwen(action="scroll", coordinate=[500, 500], pixels=300)).actions[0].gym_action == \
        {"type": "scroll", "x": 0.5, "y": 0.5, "dx": 0, "dy": -3}
    assert parse("qwen3-vl", qwen(action="scroll", pixels=-5)).actions[0].gym_action["dy"] == 1
    assert parse("qwen3-vl", qwen(action="wait", time=2)).actions[0].gym_action == {"type": "wait", "ms": 2000}


def test_qwen_drag_starts_at_the_pointer_or_start_coordinate():
    turn = parse("qwen3-vl", qwen(action="left_click_drag", coordinate=[900, 100]), pointer=(0.1, 0.2))
    assert turn.actions[0].gym_action == {"type": "drag", "x": 0.1, "y": 0.2, "x2": 0.9, "y2": 0.1}
    # the pointer moves within one reply: mouse_move then drag
    two = parse("qwen3-vl", qwen(action="mouse_move", coordinate=[100, 100]) +
                qwen(action="left_click_drag", coordinate=[200, 200]))
    assert two.actions[1].gym_action == {"type": "drag", "x": 0.1, "y": 0.1, "x2": 0.2, "y2": 0.2}
    with pytest.raises(InvalidAction, match="pointer"):
        parse("qwen3-vl", qwen(action="left_click_drag", coordinate=[900, 100]))


def test_qwen_terminal_actions():
    answer = parse("qwen3-vl", qwen(action="answer", text="42")).actions[0]
    assert answer.terminal and answer.answer == "42" and answer.gym_action is None
    done = parse("qwen3-vl", qwen(action="terminate", status="success")).actions[0]
    assert done.terminal and done.status == "success"
    # nothing after a terminal action is kept
    turn = parse("qwen3-vl", qwen(action="terminate", status="failure") + qwen(action="left_click", coordinate=[1, 1]))
    assert len(turn.actions) == 1


@pytest.mark.parametrize("content,match", [
    ("I will click the button.", "no <tool_call>"),
    ("<tool_call>{not json}</tool_call>", "not valid JSON"),
    (call("mobile_use", action="left_click", coordinate=[1, 1]), "unknown function"),
    (qwen(action="left_click", coordinate=[1001, 5]), "outside the 0..1000 grid"),
    (qwen(action="left_click"), "must be \\[x, y\\]"),
    (qwen(action="fly"), "unknown action 'fly'"),
    (qwen(action="type", text=""), "non-empty"),
    (qwen(action="terminate", status="maybe"), "status"),
    (qwen(action="key", keys=[]), "non-empty list"),
    (qwen(action="scroll", pixels=0), "non-zero"),
    (qwen(action="left_click", coordinate=[float("nan"), 3]).replace("NaN", "NaN"), "finite"),
])
def test_qwen_rejects_bad_replies_with_a_reason(content, match):
    with pytest.raises(InvalidAction, match=match):
        parse("qwen3-vl", content)


def test_one_bad_call_invalidates_the_whole_reply():
    with pytest.raises(InvalidAction):
        parse("qwen3-vl", qwen(action="left_click", coordinate=[1, 1]) + qwen(action="fly"))


def test_structured_tool_calls_and_reasoning_content_are_read():
    message = {"role": "assistant", "content": None, "reasoning_content": "think",
               "tool_calls": [{"type": "function", "function": {
                   "name": "computer_use", "arguments": json.dumps({"action": "left_click", "coordinate": [0, 1000]})}}]}
    turn = get_format("qwen3-vl").parse(message, PromptContext(instruction="t"))
    assert turn.thinking == "think"
    assert turn.actions[0].gym_action["y"] == 1.0


def test_fenced_json_and_unclosed_tool_call_are_tolerated():
    turn = parse("qwen3-vl", '<tool_call>```json\n{"name":"computer_use","arguments":{"action":"wait"}}\n```')
    assert turn.actions[0].gym_action == {"type": "wait", "ms": 1000}


def test_mai_ui_maps_its_999_grid_and_mobile_actions_onto_the_desktop():
    turn = parse("mai-ui", mai(action="click", coordinate=[999, 0]))
    assert turn.thinking == "plan"
    assert turn.actions[0].gym_action == {"type": "click", "x": 1.0, "y": 0.0, "button": "left", "count": 1}
    assert parse("mai-ui", mai(action="long_press", coordinate=[0, 0])).actions[0].gym_action["button"] == "right"
    swipe = parse("mai-ui", mai(action="swipe", direction="up")).actions[0].gym_action
    assert swipe["type"] == "scroll" and swipe["dy"] > 0  # finger up reveals content below
    assert parse("mai-ui", mai(action="system_button", button="enter")).actions[0].gym_action == \
        {"type": "key", "keys": ["enter"]}
    assert parse("mai-ui", mai(action="system_button", button="back")).actions[0].gym_action == \
        {"type": "key", "keys": ["escape"]}
    drag = parse("mai-ui", mai(action="drag", start_coordinate=[0, 0], end_coordinate=[999, 999])).actions[0]
    assert drag.gym_action == {"type": "drag", "x": 0.0, "y": 0.0, "x2": 1.0, "y2": 1.0}
    done = parse("mai-ui", mai(action="terminate", status="fail")).actions[0]
    assert done.terminal and done.status == "failure"
    assert parse("mai-ui", mai(action="answer", text="blue")).actions[0].answer == "blue"


def test_mai_ui_mobile_space_uses_the_genv_aliases():
    assert parse("mai-ui", mai(action="click", coordinate=[0, 999]), "mobile").actions[0].gym_action == \
        {"type": "tap", "x": 0.0, "y": 1.0}
    assert parse("mai-ui", mai(action="long_press", coordinate=[0, 0]), "mobile").actions[0].gym_action == \
        {"type": "long_press", "x": 0.0, "y": 0.0}
    swipe = parse("mai-ui", mai(action="swipe", direction="up", coordinate=[500, 500]), "mobile").actions[0]
    assert swipe.gym_action["type"] == "swipe" and swipe.gym_action["y2"] < swipe.gym_action["y"]
    assert parse("mai-ui", mai(action="system_button", button="home"), "mobile").actions[0].gym_action == \
        {"type": "key", "key": "home"}


@pytest.mark.parametrize("content,match", [
    (mai(action="open", text="Chrome"), "not available"),
    (mai(action="click", coordinate=[1000, 10]), "outside the 0..999 grid"),
    (mai(action="swipe", direction="sideways"), "direction"),
    (call("computer_use", action="click", coordinate=[1, 1]), "unknown function"),
])
def test_mai_ui_rejects_bad_replies(content, match):
    with pytest.raises(InvalidAction, match=match):
        parse("mai-ui", content)


def test_keyboard_format_maps_the_windows_examples_tags_to_key_chords_and_text():
    turn = parse("keyboard", "I open the Run dialog.\n<action>sendkey meta_l-r</action>\n"
                             "<action>typeline notepad</action><action>wait 1.5</action>"
                             "<action>type Hello</action><action>sendkey ctrl-s</action><done/>")
    assert [a.gym_action for a in turn.actions[:-1]] == [
        {"type": "key", "keys": ["super", "r"]}, {"type": "type", "text": "notepad\n"}, {"type": "wait", "ms": 1500},
        {"type": "type", "text": "Hello"}, {"type": "key", "keys": ["ctrl", "s"]}]
    assert turn.actions[-1].terminal and turn.actions[-1].status == "success"
    assert parse("keyboard", "<action>sendkey ret</action>").actions[0].gym_action == {"type": "key", "keys": ["enter"]}
    assert [a.name for a in parse("keyboard", "all done <done/> <action>type late</action>").actions] == ["done"]


@pytest.mark.parametrize("content,match", [
    ("I would press enter", "no <action>"),
    ("<action>click 10 20</action>", "unknown action 'click'"),
    ("<action>sendkey</action>", "sendkey needs keys"),
    ("<action>sendkey ctrl s</action>", "sendkey needs keys"),
    ("<action>type </action>", "non-empty 'text'"),
    ("<action>wait soon</action>", "number of seconds"),
    ("<action>type a</action>" * 9, "more than 8 actions"),
])
def test_keyboard_format_rejects_bad_replies_with_a_reason(content, match):
    with pytest.raises(InvalidAction, match=match):
        parse("keyboard", content)


@pytest.mark.parametrize("agent", ["qwen3-vl", "mai-ui", "keyboard"])
def test_history_keeps_the_last_n_screenshots_and_older_steps_as_text(agent):
    fmt = get_format(agent)
    ctx = PromptContext(instruction="Save the file", screen=(1280, 800), history_images=3)
    history = [HistoryStep(step=i, screenshot=f"data:image/png;base64,S{i}", feedback="fix it" if i == 4 else None,
                           reply=f"reply {i}", summary=f"did {i}") for i in range(1, 6)]
    messages = fmt.build_messages(ctx, history, "data:image/png;base64,NOW", feedback="bad reply")
    images = [p["image_url"]["url"] for m in messages if isinstance(m["content"], list)
              for p in m["content"] if p["type"] == "image_url"]
    assert images == ["data:image/png;base64,S4", "data:image/png;base64,S5", "data:image/png;base64,NOW"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    first_text = messages[1]["content"][0]["text"]
    assert "Save the file" in first_text and "Step 1: did 1" in first_text and "Step 3: did 3" in first_text
    assert "did 4" not in first_text  # step 4 is still shown with its screenshot
    assert messages[1]["content"][1] == {"type": "text", "text": "fix it"}
    assert messages[-1]["content"][0] == {"type": "text", "text": "bad reply"}
    # bounded: 20 more steps add text lines, never images
    longer = fmt.build_messages(ctx, history * 5, "data:image/png;base64,NOW", None)
    assert sum(p["type"] == "image_url" for m in longer if isinstance(m["content"], list) for p in m["content"]) == 3


def test_history_of_one_image_sends_only_the_current_screenshot():
    ctx = PromptContext(instruction="t", history_images=1)
    history = [HistoryStep(step=1, screenshot="data:a", feedback=None, reply="r", summary="s")]
    messages = get_format("qwen3-vl").build_messages(ctx, history, "data:now", None)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[1]["content"][-1]["image_url"]["url"] == "data:now"


def test_system_prompts_declare_grid_and_function():
    qwen_prompt = get_format("qwen3-vl").system_prompt(PromptContext(instruction="t", screen=(1280, 800)))
    assert '"name": "computer_use"' in qwen_prompt and "1000x1000" in qwen_prompt and "1280x800" in qwen_prompt
    for action in ("key", "type", "mouse_move", "left_click", "left_click_drag", "right_click", "middle_click",
                   "double_click", "triple_click", "scroll", "wait", "terminate", "answer"):
        assert f'"{action}"' in qwen_prompt
    mai_prompt = get_format("mai-ui").system_prompt(PromptContext(instruction="t"))
    assert '"mobile_use"' in mai_prompt and "0..999" in mai_prompt and "<thinking>" in mai_prompt


def test_mai_ui_hotkey_exists_on_pc_only():
    assert parse("mai-ui", mai(action="hotkey", keys=["ctrl", "s"])).actions[0].gym_action == \
        {"type": "key", "keys": ["ctrl", "s"]}
    with pytest.raises(InvalidAction, match="only available on a desktop"):
        parse("mai-ui", mai(action="hotkey", keys=["ctrl", "s"]), "mobile")
    fmt = get_format("mai-ui")
    assert '"hotkey"' in fmt.system_prompt(PromptContext(instruction="t", space="pc"))
    assert '"hotkey"' not in fmt.system_prompt(PromptContext(instruction="t", space="mobile"))
