"""config.yaml / config.cpu.yaml / CUAConfig through AReaL's own load_expr_config (no GPU needed)."""

import dataclasses
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from areal.api.cli_args import GRPOConfig
from omegaconf import OmegaConf

from cua_rl.config import CUAConfig, parse_number_ranges, resolve_project_token, resolve_tiny_model_dir
from cua_rl.run import cli
from tests.benches import bench_module
from tests.run.cli_cases import ALL_FLAGS, EXAMPLE, load

SECTION_5_2_KEYS = {  # the original example's keys (one per flag), with our defaults
    "max_turns": 20, "max_task_time_seconds": 600, "max_turn_time_seconds": 120, "gym_base_url": "",
    "gym_id": "", "gym_train_ratio": 0.8, "gym_split_type": "train", "gym_limit": None, "gym_seed": 42,
    "gym_tags": None, "gym_eval_number_range": None, "gbox_mini_agent_base_url": "http://127.0.0.1:3000",
    "gbox_mini_agent_agent": "qwen3-vl", "gbox_mini_agent_standard_action_space": "pc", "model_base_url": "",
    "model_name": "", "monitor_base_url": "", "project_id": "", "project_token": "",
}


def saved_config(tmp_path: Path) -> str:
    (path,) = tmp_path.glob("logs/*/*/*/config.yaml")
    return path.read_text()


def test_cuaconfig_extends_grpo_with_every_section_5_2_key():
    assert issubclass(CUAConfig, GRPOConfig)
    defaults = CUAConfig()
    for key, value in SECTION_5_2_KEYS.items():
        assert getattr(defaults, key) == value, key
    assert defaults.policy.port == 0 and defaults.policy.bind_host == "auto"
    assert defaults.task_source.kind == "gym" and defaults.embedded.enabled is None
    assert defaults.embedded_enabled  # no gym URL: the embedded stack
    assert not dataclasses.replace(defaults, gym_base_url="http://127.0.0.1:5010").embedded_enabled


def test_no_public_address_in_the_defaults_or_the_config_files(tmp_path):
    def strings(obj):
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                yield from strings(getattr(obj, f.name))
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                yield from strings(item)
        elif isinstance(obj, str):
            yield obj
    configs = (CUAConfig(), load(tmp_path / "gpu"), load(tmp_path / "cpu", config="config.cpu.yaml"))
    urls = [s for cfg in configs for s in strings(cfg) if "://" in s]
    assert any("3000" in url for url in urls), "expected the agent URL among the checked values"
    for url in urls:
        assert urlparse(url).hostname in ("127.0.0.1", "localhost"), url


def test_gpu_config_loads_with_the_documented_choices(tmp_path):
    cfg = load(tmp_path)
    assert cfg.actor.path == "Qwen/Qwen3-VL-2B-Instruct" and cfg.tokenizer_path == cfg.actor.path
    assert cfg.rollout.backend.startswith("vllm:") and cfg.actor.backend.startswith("fsdp:")
    assert cfg.actor.weight_update_mode == "disk"
    assert (cfg.gconfig.n_samples, cfg.gconfig.temperature, cfg.gconfig.greedy) == (4, 1.0, False)
    assert cfg.actor.reward_norm is None
    assert (cfg.actor.adv_norm.mean_level, cfg.actor.adv_norm.std_level) == (None, "batch")   # group baseline only
    assert cfg.actor.recompute_logprob and cfg.actor.use_decoupled_loss
    assert cfg.rollout.consumer_batch_size == cfg.train_dataset.batch_size
    for section in (cfg.saver, cfg.evaluator, cfg.recover, cfg.stats_logger):
        assert section.fileroot == str(tmp_path)
    assert cfg.rollout.fileroot == str(tmp_path)
    assert cfg.eval_workflow == cfg.workflow
    assert cfg.actor.scheduling_spec[0].gpu == 1
    assert "max_turns: 20" in saved_config(tmp_path)  # AReaL saved the resolved config under the fileroot


def test_cpu_overlay_starts_from_config_yaml(tmp_path, monkeypatch):
    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = load(tmp_path, config="config.cpu.yaml")
    tiny = str(tmp_path / "home" / "models" / "tiny-qwen3-vl")
    assert cfg.embedded.tiny_model_dir == tiny and cfg.actor.path == tiny == cfg.vllm.model
    assert resolve_tiny_model_dir(cfg) == tiny
    assert (cfg.rollout.backend, cfg.actor.backend, cfg.actor.weight_update_mode) == ("vllm:d1", "fsdp:d1", "disk")
    assert cfg.actor.attn_impl == "sdpa" and cfg.actor.scheduling_spec[0].gpu == 0
    # inherited from config.yaml
    assert cfg.workflow == "cua_rl.workflow.CUAAgentWorkflow" and cfg.actor.use_decoupled_loss
    assert cfg.actor.optimizer.type == "adam" and cfg.actor.optimizer.lr == 1e-5
    assert not cfg.sft.warm_start and cfg.task_source.kind == "gym"   # with --gym: your gym's tasks as they are


def test_learn_config_is_the_cpu_stack_learning_a_curriculum_family_from_a_warm_start(tmp_path, monkeypatch):
    from cua_rl.local_gym import load_tasks

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = load(tmp_path, config="config.learn.yaml")
    assert cfg.rollout.backend == "vllm:d1" and cfg.actor.path == str(tmp_path / "home" / "models" / "tiny-qwen3-vl")
    assert cfg.sft.warm_start and cfg.trajectory.shuffle_rewards is False
    assert cfg.task_source.task_ids == cfg.sft.tasks
    assert all(load_tasks().get(t).family for t in cfg.sft.tasks)
    assert cfg.actor.optimizer.type == "sgd" and cfg.gconfig.n_samples >= 2
    control = load(tmp_path / "c", "trajectory.shuffle_rewards=true", config="config.learn.yaml")
    assert control.trajectory.shuffle_rewards
    # the bench's controls are overrides of the recipe a user runs (each key must be in config.yaml's schema)
    bench = bench_module("learning_bench")
    for i, override in enumerate(bench.CONTROLS.values()):
        key = override.split("=")[0].split(".")[1]
        assert getattr(load(tmp_path / f"k{i}", override, config="config.multiturn.yaml").trajectory, key) is True
    for i, overrides in enumerate(bench.MUTATIONS.values()):   # and its mutations (each one or more overrides)
        loaded = load(tmp_path / f"m{i}", *overrides.split(), config="config.multiturn.yaml")
        for override in overrides.split():
            key, value = override.split("=")
            section, name = key.split(".")
            assert str(getattr(getattr(loaded, section), name)).lower() == value.lower()


@pytest.mark.parametrize("recipe", sorted(p.name for p in EXAMPLE.glob("config*.yaml")))
def test_no_recipe_trains_a_step_at_learning_rate_zero(tmp_path, monkeypatch, recipe):
    """Every step of every recipe trains at its learning rate: the schedule AReaL's FSDP engine builds (its own
    functions, the run's FinetuneSpec as AReaL's trainer computes it) gives step 1 a positive rate. AReaL's
    default warm-up (0.001 of the steps, which starts at 0) gave the CPU recipes' first step lr 0."""
    import torch
    from areal.api.io_struct import FinetuneSpec
    from areal.engine import fsdp_engine

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = load(tmp_path, config=recipe)
    opt = cfg.actor.optimizer
    steps_per_epoch = max(1, (cfg.total_train_steps or 1000) // cfg.total_train_epochs)
    spec = FinetuneSpec(total_train_epochs=cfg.total_train_epochs,
                        dataset_size=steps_per_epoch * cfg.train_dataset.batch_size,
                        train_batch_size=cfg.train_dataset.batch_size)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=opt.lr)
    warmup = int(opt.warmup_steps_proportion * spec.total_train_steps)
    schedule = {"constant": lambda: fsdp_engine.get_constant_schedule_with_warmup(optimizer, warmup),
                "linear": lambda: fsdp_engine.get_linear_schedule_with_warmup(optimizer, warmup,
                                                                              spec.total_train_steps),
                "cosine": lambda: fsdp_engine.get_cosine_schedule_with_warmup(
                    optimizer, warmup, spec.total_train_steps, min_lr_ratio=opt.min_lr_ratio)}[opt.lr_scheduler_type]()
    first = schedule.get_last_lr()[0]     # the rate the first optimizer step uses
    assert first > 0 and first == pytest.approx(opt.lr), (recipe, first, warmup, spec.total_train_steps)


def test_multiturn_config_keeps_every_screenshot_so_an_episode_trains_as_one_row(tmp_path, monkeypatch):
    """config.multiturn.yaml: the key-sequence family, failures run to max_turns, and the agent (run request
    field), the endpoint and the demonstrations all keep every screenshot of an episode, so its prompts chain
    and ``concat`` exports one row per episode; the agent's field reaches each run request."""
    from cua_rl.local_gym import load_tasks
    from cua_rl.workflow import workflow_kwargs

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = load(tmp_path, config="config.multiturn.yaml")
    # SFT demonstrates key-sequence; training draws its trained sequences as the drill does (yellow more often)
    assert [load_tasks().get(t).family for t in cfg.sft.tasks] == ["key-sequence"]
    assert [load_tasks().get(t).family for t in cfg.task_source.task_ids] == ["key-sequence-drill"]
    assert cfg.max_turns > 4 and cfg.trajectory.export_style == "concat"
    assert cfg.gbox_mini_agent_extra == {"historyImages": cfg.max_turns} and \
        cfg.policy.max_screenshots_in_history == cfg.sft.history_images == cfg.max_turns
    kwargs = workflow_kwargs(cfg, cfg.gconfig, 4)
    assert kwargs["agent"].extra == {"historyImages": cfg.max_turns}
    assert load(tmp_path / "d", config="config.learn.yaml").gbox_mini_agent_extra == {}


def test_the_test_vllm_server_is_the_one_the_cpu_config_launches(tmp_path, monkeypatch):
    """VLLMServer (tests, benches) must start vLLM exactly as AReaL does from config.cpu.yaml, so what the
    gates prove holds for training: the same server flags, the same CPU worker extension, the same
    logprobs mode (processed: after temperature), and the trainer workers get the packed-sdpa patch."""
    from areal.api.cli_args import vLLMConfig

    from cua_rl.local_model.vllm_server import cpu_vllm_config

    monkeypatch.setenv("CUA_RL_HOME", str(tmp_path / "home"))
    cfg = load(tmp_path, config="config.cpu.yaml")
    ours = cpu_vllm_config(cfg.vllm.model, seed=cfg.vllm.seed)
    assert vLLMConfig.build_args(cfg.vllm, 1, 1) == vLLMConfig.build_args(ours, 1, 1)
    assert cfg.vllm.logprobs_mode == "processed_logprobs"
    # no multimodal processor cache: its two copies can disagree and then the engine fails every request
    # (vllm#31404; cua_rl/areal_ext/vllm_config.py), in every recipe
    for name in ("config.cpu.yaml", "config.yaml", "config.multiturn.yaml"):
        cmd = vLLMConfig.build_cmd_from_args(vLLMConfig.build_args(load(tmp_path / name, config=name).vllm, 1, 1))
        assert " --mm-processor-cache-gb 0.0 " in f"{' '.join(cmd)} ", cmd
    assert cfg.vllm.worker_extension_cls == "cua_rl.local_model.vllm_cpu.CPUWorkerExtension"
    assert cfg.actor.scheduling_spec[0].cmd == "python3 -m cua_rl.areal_ext.worker"


def test_every_worker_runs_our_worker_module_and_another_command_is_refused(tmp_path):
    """AReaL's local scheduler starts each role's workers from ``scheduling_spec[0].cmd``: without our worker's
    patches the FSDP engine would read the rows' palette-coded images as pixels. AReaL's own command (its
    default, what its example configs write) becomes ours, the rest of the command kept; another is refused;
    under Ray (no command, a setup hook instead) nothing is changed."""
    assert [s.cmd for s in CUAConfig().actor.scheduling_spec] == ["python -m cua_rl.areal_ext.worker"]
    areal = "'nice -n 5 python -m areal.infra.rpc.rpc_server'"
    cfg = load(tmp_path, f"actor.scheduling_spec.0.cmd={areal}")   # config.yaml's rollout takes the actor's
    assert [cfg.actor.scheduling_spec[0].cmd, cfg.rollout.scheduling_spec[0].cmd] == \
        ["nice -n 5 python -m cua_rl.areal_ext.worker"] * 2
    with pytest.raises(Exception, match=r"actor.scheduling_spec\[0\].cmd 'python -m my.worker': the workers here run"):
        load(tmp_path, "actor.scheduling_spec.0.cmd='python -m my.worker'")
    ray = load(tmp_path, "scheduler.type=ray", f"actor.scheduling_spec.0.cmd={areal}")
    assert ray.actor.scheduling_spec[0].cmd == "nice -n 5 python -m areal.infra.rpc.rpc_server"


def test_train_sh_overrides_load_into_the_intended_values(tmp_path):
    flags = [f for i, f in enumerate(ALL_FLAGS) if "--model-base-url" not in ALL_FLAGS[max(i - 1, 0):i + 1]]
    request = cli.parse([*flags, "actor.optimizer.lr=1e-6"], {}, [])
    cfg = load(tmp_path, *request.overrides)
    assert (cfg.gym_base_url, cfg.gym_id) == ("http://127.0.0.1:5010", "desk")
    assert cfg.gbox_mini_agent_base_url == "http://127.0.0.1:3100"
    assert (cfg.gbox_mini_agent_agent, cfg.gbox_mini_agent_standard_action_space) == ("mai-ui", "mobile")
    assert (cfg.model_base_url, cfg.model_name) == ("", "m1")
    assert (cfg.monitor_base_url, cfg.project_id) == ("http://127.0.0.1:9000", "p1")
    assert cfg.train_dataset.batch_size == cfg.valid_dataset.batch_size == cfg.rollout.consumer_batch_size == 2
    assert (cfg.max_turns, cfg.max_task_time_seconds, cfg.max_turn_time_seconds) == (7, 300, 30)
    assert cfg.rollout.max_concurrent_rollouts == 3
    assert (cfg.gym_train_ratio, cfg.gym_seed, cfg.gym_limit) == (0.5, 0, 10)
    assert cfg.gym_tags == ["easy", "normal"] and cfg.gym_eval_number_range == "001-032"
    assert cfg.actor.optimizer.lr == 1e-6
    assert not cfg.embedded_enabled
    # the token went through the environment only: not in the config AReaL saved to disk
    assert cfg.project_token == "" and "tok" not in saved_config(tmp_path).replace("token", "")
    assert resolve_project_token(cfg, {"PROJECT_TOKEN": "tok"}) == "tok"
    assert resolve_project_token(cfg, {"MONITOR_PROJECT_TOKEN": "old"}) == "old"


def test_strings_that_look_like_numbers_stay_strings(tmp_path):
    request = cli.parse(["--gym", "http://127.0.0.1:1", "--gym-id", "007", "--model-name", "Qwen 3,VL"], {}, [])
    cfg = load(tmp_path, *request.overrides)
    assert cfg.gym_id == "007" and cfg.model_name == "Qwen 3,VL"


def test_every_key_a_flag_sets_is_in_config_yaml():
    """So the flags' plain `key=value` overrides never need Hydra's `+`."""
    document = OmegaConf.create(yaml.safe_load((EXAMPLE / "config.yaml").read_text()))
    missing = object()
    for override in cli.parse(ALL_FLAGS, {}, []).overrides:
        key = override.split("=", 1)[0]
        assert OmegaConf.select(document, key, default=missing) is not missing, key


@pytest.mark.parametrize("override, message", [
    ("gym_train_ratio=1.5", "gym_train_ratio must be within"),
    ("gym_eval_number_range=abc", "gym_eval_number_range: bad task number range"),
    ("gym_seed=-1", "gym_seed must be >= 0"),
    ("gym_tags=[easy,'a;b']", "gym_tags: bad tag 'a;b'"),
    ("train_dataset.batch_size=0", "train_dataset.batch_size must be >= 1"),
    ("rollout.max_concurrent_rollouts=0", "rollout.max_concurrent_rollouts must be >= 1"),
    ("gym_split_type=test", "gym_split_type must be one of"),
    ("max_turns=0", "max_turns must be positive"),
    ("task_source.kind=file", "needs task_source.task_file"),
    ("task_source.kind=web", "task_source.kind must be one of"),
    ("policy.port=70000", "policy.port must be 0..65535"),
    ("embedded.num_desktops=0", "embedded.num_desktops must be >= 1"),
    ("embedded.tasks_dir=/nonexistent/tasks", "embedded.tasks_dir '/nonexistent/tasks' is not a folder"),
    ("embedded.reuse_browsers=-1", "embedded.reuse_browsers must be 0 \\(never\\) or more, got -1"),
    ("trajectory.format_reward=-1", "trajectory.format_reward must be within"),
    ("trajectory.export_style=tree", "trajectory.export_style must be one of"),
    ("trajectory.turn_discount=0", "trajectory.turn_discount must be within"),
    ("trajectory.export_style=concat trajectory.turn_discount=0.9",
     "trajectory.turn_discount 0.9 needs export_style individual"),
    # multi-turn credit and the behaviour policy (tests/trajectory/test_multiturn_credit.py shows why)
    ("actor.adv_norm.mean_level=batch", "adv_norm.mean_level must be null while trajectory.normalise_in_group"),
    ("actor.temperature=0.7", r"actor.temperature \(0.7\) must equal gconfig.temperature"),
    ("gconfig.greedy=true", "gconfig.greedy must be false"),
    ("gconfig.top_p=0.9", "gconfig.top_p must be 1.0"),
    ("gconfig.top_k=50", "gconfig.top_k must not truncate"),
    ("gconfig.frequency_penalty=0.5", "gconfig.frequency_penalty must be 0"),
    ("gconfig.max_tokens=32768", r"gconfig.max_tokens \(32768\) exceeds actor.mb_spec.max_tokens_per_mb"),
    ("vllm.max_model_len=8192", r"gconfig.max_tokens \(16384\) exceeds vllm.max_model_len \(8192\)"),
    ("gconfig.max_new_tokens=16384", "gconfig.max_new_tokens \\(16384\\) must be below gconfig.max_tokens"),
])
def test_bad_values_fail_at_load_time(tmp_path, override, message):
    with pytest.raises(Exception, match=message):
        load(tmp_path, *override.split(" "))


def test_restart_in_page_needs_reused_browsers(tmp_path):
    """null (the gym's default) or 2 or more; a new browser per episode has no page to restart in."""
    with pytest.raises(Exception, match="embedded.restart_in_page .* needs embedded.reuse_browsers 2 or more, got 0"):
        load(tmp_path, "embedded.reuse_browsers=0", "embedded.restart_in_page=true")
    assert load(tmp_path, "embedded.restart_in_page=true").embedded.restart_in_page is True


def test_number_ranges():
    assert parse_number_ranges("001-032") == [(1, 32)]
    assert parse_number_ranges("1-8, 12,20-24") == [(1, 8), (12, 12), (20, 24)]
    for bad in ("", "a-b", "5-1", "1-2-3"):
        with pytest.raises(ValueError):
            parse_number_ranges(bad)


def test_a_health_threshold_is_set_as_the_docs_say_and_a_misspelt_one_refused():
    """docs/health.md's command: ``config.yaml`` names no threshold, so one is added with Hydra's ``+``."""
    from cua_rl.run.launch import load_config

    config = load_config(str(EXAMPLE / "config.yaml"), ["+health.thresholds.idle_seconds=600", "health.on_anomaly=warn"])
    assert config.health.thresholds == {"idle_seconds": 600.0} and config.health.on_anomaly == "warn"
    with pytest.raises(BaseException, match="unknown invariants"):
        load_config(str(EXAMPLE / "config.yaml"), ["+health.thresholds.idle_second=600"])


def test_several_gyms_from_the_flag_a_yaml_list_or_a_file(tmp_path):
    """Issue 64: ``gym_base_url`` is one URL or a fleet, held in one written form (``URL,URL``) whatever way it was
    given; a bad URL fails at load naming the flag; a fleet's every host must be routable on Ray (ray_cluster)."""
    request = cli.parse(["--gym", "http://10.0.0.1:5010,http://10.0.0.2:5010/", "--gym-id", "desktop"], {}, [])
    cfg = load(tmp_path, *request.overrides, "trial_name=t1")
    assert cfg.gym_base_url == "http://10.0.0.1:5010,http://10.0.0.2:5010" and not cfg.embedded_enabled
    assert cfg.gym_urls == ["http://10.0.0.1:5010", "http://10.0.0.2:5010"]
    assert load(tmp_path, "gym_base_url=[http://a:1,http://b:2]", "trial_name=t2").gym_urls == ["http://a:1", "http://b:2"]
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("http://a:1\n# spare\nhttp://c:3\n")
    request = cli.parse(["--gym", f"@{hosts}"], {}, [])
    assert load(tmp_path, *request.overrides, "trial_name=t3").gym_base_url == "http://a:1,http://c:3"
    from cua_rl.run.launch import ConfigError, load_config

    request = cli.parse(["--gym", "http://a:1,ftp://b"], {}, [])
    with pytest.raises(ConfigError, match=r"gym_base_url: gym URL 'ftp://b'.*\(set by --gym / GYM_BASE_URL\)"):
        load_config(str(EXAMPLE / "config.yaml"), [*request.overrides, f"cluster.fileroot={tmp_path}"],
                    request.flag_keys)
    with pytest.raises(ValueError, match="needs scheduler.type=ray"):
        load(tmp_path, "gym_fleet.ray_gyms.enabled=true", "trial_name=t4")
    ray = load(tmp_path, "gym_fleet.ray_gyms.enabled=true", "scheduler.type=ray", "trial_name=t5")
    assert not ray.embedded_enabled and ray.gym_id == "desktop"   # our gyms on Ray: no embedded stack


def test_tree_groups_are_checked_at_load(tmp_path):
    """Tree groups (cua_rl/workflow/tree.py): off by default; on, their branch turns and their needs of the rest of
    the config are checked when it loads, each refusal naming the key."""
    assert load(tmp_path, "trial_name=t0").tree.enabled is False
    tree = load(tmp_path, "tree.enabled=true", "tree.branch_turns=[2,3]", "tree.branches=2", "trial_name=t1").tree
    assert tree.branch_turns == [2, 3] and tree.branches == 2
    for overrides, message in [
        (["tree.branch_turns=[1]"], r"tree.branch_turns must be increasing turns >= 2"),
        (["tree.branch_turns=[3,2]"], r"tree.branch_turns must be increasing"),
        (["tree.branches=0"], r"tree.branches must be within 1..8"),
        (["tree.enabled=true", "max_turns=2", "tree.branch_turns=[3]"], r"reach past max_turns \(2\)"),
        (["tree.enabled=true", "gym_base_url=[http://a:1,http://b:2]"], "tree groups play on one gym host"),
        (["tree.enabled=true", "trajectory.shuffle_screenshots=true"], "no screenshot-swap control"),
    ]:
        with pytest.raises(Exception, match=message):
            load(tmp_path, *overrides, "trial_name=t2")
