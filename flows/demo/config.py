"""The demo's configuration: the simulated world's size, the warm start, every round's update
and the learner's sampling, with the defaults `make demo` runs (tuned with
benchmarks/learning_curve.py; see flows.demo.run)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flows.stages.train_options import TrainOptions, config_with_overrides
from flows.tracking import ReportTo
from futureworld.domain import GenerationSettings, QuestionKind
from futureworld.rewards import RewardFn
from futureworld.rl.config import DEFAULT_ESTIMATOR, Estimator, TrainConfig

if TYPE_CHECKING:
    from flows.demo.researcher import ResearcherPolicy
    from futureworld.world import WorldConfig

LEARNER = "forecaster"
CROWD = "crowd"
WARM_START_VERSION = 1
"""The learner's supervised warm start: the version after its base model (version 0)."""
NOTE_TURN_TOKENS = 48
"""A research turn's budget when the reference notes its readings: a note of two readings
and the answer, with room for a tokenizer trained on a short warm start's texts."""


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """What the demo runs; the defaults are `make demo`'s: the research world, where no
    question states its cue and the agent searches before it answers (`research`; the
    one-turn demo on the cue-stating world is `research=False`, `--no-research`).

    Model size, research on: the research demo keeps the 64-wide, 2-layer model; 128 wide
    learnt no better query on the same demonstrations (evidence found 0.19 against 0.21,
    seed 0). What the warm start must teach last is the query: copying the question's entity
    (a name of 30 stems) and event into the search. Its warm start is 20 days of whole
    demonstrations plus 80 days of first-turn drills (`research_drill_days`), 16 a step at
    lr 4e-3 decaying to zero, packed several to a row: on seed 0 its searches find the
    question's evidence on 0.36-0.61 of the panel's rollouts against 0.00 with 200 whole
    demonstrations and 0.07-0.23 with 800 (benchmarks/research_warm_start.py; docs/results.md,
    "The research warm start").
    Whether the copy forms varied from run to run (0.15-0.61 of its queries were the title's
    words) while subjects recurred within days; on the research world with a subject cycle and
    150 entities (`research_entities`) 0.97-0.99 are, and the warm start reads what it finds
    (docs/results.md, "Subjects asked once a cycle"). On 2 Zen 5 cores seeds 0-4 learned by
    the whole claim on the 1920-question panel (`research_panel_questions`); seed 0 took
    11.6 min alone, as long as the 960-question default right after it, which had taken 9.2
    an hour earlier on the same cores (docs/results.md, "The research demo as the default").
    On 2 Zen 3 cores, with the rounds between scored on the panel's head
    (`research_round_panel_questions`), seeds 0, 2, 3 and 4 learned by the whole claim and
    seed 1 by Brier but not ECE (+0.0041 over the interval's bound); seed 0 took 13.6 min
    alone (docs/results.md, "The research panel's head scores the rounds between").
    On the 960-question panel before it, every run of seeds 0-6 on three machines learned to search,
    beat the uninformed floor and improved Brier, but a third missed the ECE interval, seed 1
    on all three; rescored on 1920 questions seed 1's last version learned by the whole
    claim. Whether the tiny model learns to read at all is a draw of the warm start, and of
    the machine's float rounding (docs/results.md, "A seeded research run repeats, and the
    warm start's reading is a draw").
    """

    out_dir: Path = Path("reports/demo")
    """Report folder; the demo's database, model and checkpoints go to `out_dir/state`."""
    resume: bool = False
    """Continue the demo that `out_dir/state` holds (killed or failed after its warm start)
    instead of starting afresh: the warm start and the finished rounds are kept, and the
    results equal an uninterrupted run's (flows.demo.resume). Refused unless the state was
    made with the same configuration (all but `out_dir`, `report_to`)."""
    rounds: int = 30
    """Simulated days of the daily cycle."""
    questions_per_day: int = 40
    """New questions the world poses each day."""
    samples: int = 8
    """Rollouts per question (the group size G)."""
    seed: int = 0
    max_horizon_days: int = 2
    """Questions resolve 1..this many days after they are posed: rewards arrive with delay,
    and part of every update is trained on rollouts of an older policy version."""
    panel_questions: int = 2000
    """Held-out questions every round's policy forecasts (the same ones, the same outcomes)."""
    panel_samples: int = 1
    """Forecasts per panel question: the outcome noise is per question, so many questions
    with one sample each measure a policy better than fewer questions sampled repeatedly."""
    sft_days: int = 10
    """Days of the reference's forecasts the warm start learns (research off): 10 x 40 = 400
    demonstrations, 15 epochs. The former 5 x 20 warm start parsed 0.878 of seed 3's round-0
    panel, below the 90% rule before any update; 10 x 15 parses 0.976-0.992 on seeds 0-7
    (docs/results.md, "The warm start's format on eight seeds"). With the rejection backoff
    it learned within the whole bar on eight seeds of eight ("The defaults on eight seeds:
    the 10 x 15 warm start and a backed-off retry")."""
    sft_questions_per_day: int = 40
    sft_sharpening: float = 3.0
    """The reference's over-confidence: its log-odds are this multiple of the truth's."""
    sft_noise_logit: float = 1.0
    """Noise on the warm-start targets' log-odds, so the policy keeps spread to explore."""
    sft_epochs: int = 15
    sft_learning_rate: float = 1e-3
    rl_learning_rate: float = 1e-3
    """Each RL update's learning rate (research off; `research_rl_learning_rate` on)."""
    rl_kl_coef: float = 0.0
    """k3 KL penalty of every RL update to the supervised warm start (`WARM_START_VERSION`),
    or with `rl_kl_trail` to a trailing version; 0 = off."""
    rl_kl_trail: int | None = None
    """Anchor the KL penalty to the version this many promotions before each update's base
    (`TrainOptions.kl_trail`), never older than the warm start; None: the warm start."""
    rl_draw_groups: int | None = None
    """Each update trains on at most this many groups drawn from those waiting
    (`TrainOptions.draw_groups`); None: all of them. 40 ended the rejection streaks of seeds 4
    and 5 (updates of up to 482 and 946 groups after a rejection; docs/results.md, "Eight
    seeds of the defaults with the fit rule and equal rollout counts"). Not the default: on
    eight seeds it learned on 6 and within the whole bar on 4, as many as without it ("The
    bounded draw on eight seeds")."""
    rl_rejection_backoff: float | None = 0.5
    """After a rejected update, the next from the same parent trains at the learning rate ×
    this^k, k the parent's rejected versions (`TrainOptions.rejection_backoff`); None: each
    retry at the full rate. 0.5 ended the rejection streaks that stopped learning (seed 4's
    nine parse-rate rejections in a row at the full rate; docs/results.md, "The defaults on
    eight seeds: the 10 x 15 warm start and a backed-off retry")."""
    rl_groups_per_step: int = 5
    """Whole groups per optimiser step: 5 questions × G = 8 = the 40 rollouts a step tuned
    with benchmarks/learning_curve.py (gradients accumulate over the step's rows)."""
    estimator: Estimator = DEFAULT_ESTIMATOR
    """The RL updates' estimator. It also decides the learner's sampling (a belief elicited
    after each tool turn for the estimators that credit turns by it), so an `estimator=` in
    `train_set` is this field: the last one given there replaces it."""
    min_groups: int = 4
    """Train in a round only when at least this many completed groups are waiting."""
    temperature: float = 1.0
    hidden_size: int = 64
    layers: int = 2
    kinds: tuple[QuestionKind, ...] = (QuestionKind.BINARY,)
    """Question kinds the world poses: binary always, choice and numeric on request."""
    kind_questions_per_day: int = 10
    """Choice and numeric questions the world poses a day, of each kind in `kinds`."""
    kind_panel_questions: int = 300
    """Held-out panel questions per choice or numeric kind, one sample each."""
    kind_max_new_tokens: int = 64
    """A turn's token budget when choice or numeric questions are posed: their answers are
    longer than a probability (on the research world, every research turn's, for the
    reference's choice and numeric answers of up to 38 tokens)."""
    research: bool = True
    """Run on a research world (`WorldConfig(research=True)`): no question states its cue, its
    evidence articles do. The learner then researches multi-turn (`research_max_turns`, search
    and open), warm-starts on a scripted reference researcher's rollouts
    (flows.demo.researcher) and is scored on a research panel forecast through the same
    engine over the panel world's articles (flows.demo.research_panel)."""
    research_max_turns: int = 3
    """Turns of a research rollout: a search, an open, an answer."""
    research_max_new_tokens: int = 24
    """A research turn's budget: the longest action (a query of entity and event, or an
    answer) is 11 tokens with the demo's tokenizer; 24 leaves a sampled query room."""
    research_search_k: int = 2
    """Results a research search shows: a question's two evidence articles match every word
    of an "<entity> <event>" query, so they rank first unless another question shares its
    entity and event; every result lengthens the sequences the warm start and each update
    forward (on 2 cores the warm start's cost is the sequences' length)."""
    research_entities: int = 150
    """The research world's entities (WorldConfig.n_entities, 40 with research off): with
    subjects drawn without replacement (WorldConfig.research_unique_subjects) a subject recurs
    after n × 4 questions, 15 days of 40 at 150, after the earlier question on it has closed and
    been reported, so an "<entity> <event>" search shows exactly its question's two evidence
    articles for 784 of the warm world's first 800 questions (407 with 40 entities drawn per
    question, as before; 589 with 40 in a cycle, which recurs within 4 days, while the earlier
    question's report is news)."""
    research_sft_days: int = 20
    """Days of the reference researcher's rollouts the research warm start learns: 20 x 40 =
    800 demonstrations. Copying the question's entity and event into a query is what a tiny
    model learns last: 200 demonstrations teach the tool-call format but no query that finds
    the evidence (0.00 of the panel's rollouts on seed 0); 800 find it on 0.07-0.23
    (benchmarks/research_warm_start.py; docs/results.md, "The research warm start")."""
    research_drill_days: int = 80
    """Days of further questions whose reference rollouts the research warm start learns only
    the first turn of (`researcher.first_turn`: the prompt and the search or answer, without
    the observation): short rows that teach the query, which a whole demonstration teaches
    one token in ~250. They cost time: the warm start took 4.5 min with them, packed, beside
    the test suite (9.7 min with a row each, two demos at a time), against 1.6 min without."""
    research_sft_epochs: int = 10
    """Warm-start epochs on the research demonstrations (their rows are ~5x the brief one-turn
    rows, so the brief demo's epochs on them would cost ~5x its warm start)."""
    research_sft_learning_rate: float = 4e-3
    """The research warm start's learning rate (its peak, `research_sft_lr_decay`): few epochs,
    16 rows a step, so a larger step."""
    research_sft_lr_decay: bool = True
    """Decay the research warm start's learning rate linearly to zero (TrainConfig.lr_decay).
    At a constant 4e-3 the model it ended with still put a few percent on a tool's closing tag
    after an answer's value ("<probability>0.93</open>"): seed 1's panel parsed 0.81, seed 3's
    0.96; decayed, 0.985 and 0.981 (benchmarks/research_warm_start.py; docs/results.md, "The
    research warm start's learning rate decays")."""
    research_rl_learning_rate: float = 5e-4
    """Each RL update's learning rate on the research world. At the binary demo's 1e-3 the
    updates of seeds 1 and 3 often made the policy worse (seed 3: 13 of 29 versions rejected,
    the panel back from 0.2165 to 0.2253 over its last ten rounds); at 5e-4 seed 3 had 1
    rejected and seed 4 learned within the whole claim (docs/results.md, "The research demo
    with a decayed warm start and half the RL rate")."""
    research_sft_groups_per_step: int = 16
    """Demonstrations (whole or drills) per optimiser step of the research warm start."""
    research_panel_questions: int = 1920
    """Held-out research-panel questions, one sample each. The claim's ECE interval needs
    them: an improvement of ECE by about 0.03 is within the interval's half-width on 960
    questions (±0.027 on seed 1, whose last version learned by the whole claim rescored on
    1920 and on 3840; benchmarks/research_claim_panel.py; docs/results.md, "The research demo
    as the default"), as it was on 480 for seeds 0, 2 and 3 ("The research demo with a
    decayed warm start and half the RL rate"). The panel researches in its own process
    beside the next round's cycle, which leaves part of the 2 cores idle (a run used 1.27 of
    them on average), and a run of the 1920-question default took as long as one of 960.
    That held on a Zen 5; on a Zen 3 the two processes kept both cores busy through the
    rounds, and the panel was half their work (`research_round_panel_questions`)."""
    research_round_panel_questions: int | None = 480
    """The head of the research panel (its first questions, the same ones every round) that
    the rounds between the first and the last are scored on; round 0 and the last round,
    which the claim compares, are scored on the whole panel, and on the head as well (the
    head's scores of every round are the per-round table and curves, so every round is one
    question set). None, or at least the whole panel: every round is scored on the whole
    panel. A round's Brier on 480 questions is within about ±0.02 (95%), which a curve over
    30 rounds can show; the paired claim needs all 1920. The panel is the rounds' largest
    job after the cycle's, and a quarter of it left the cycle's process most of the second
    core (docs/results.md, "The research panel's head scores the rounds between")."""
    research_search_rate: float = 0.7
    """Share of the reference researcher's rollouts that search (the rest answer the prior)."""
    research_poor_query_rate: float = 0.3
    """Share of its searches that query the entity alone (a poor query)."""
    research_open_rate: float = 0.2
    """Share of its searches followed by opening the top result."""
    research_sharpening: float = 2.0
    """Its answers' log-odds are this multiple of the posterior from the readings it saw. RL
    keeps an over-confident reading (2: the learner's answers after reading stayed at slope
    1.5-2.1 through 29 updates) and corrects an under-confident one (1.0 on seed 1: slope
    0.63 -> 0.88; docs/results.md, "A research round profiled, and what RL changes in the
    agent's answers"). At 1.5, seeds 0-4 in repeatable runs learned by the whole claim on two
    (2 and 3), against four of six runs at 2 that did not repeat, on the same machine ("A
    seeded research run repeats, and the warm start's reading is a draw"); at 2 on another
    machine, four of seven repeatable runs ("The default on seeds 0-6 as repeatable runs, on
    another machine")."""
    research_noise_logit: float = 0.5
    """Std of the Gaussian noise on its answers' log-odds."""
    research_plain_kind_answers: bool = False
    """The reference's choice and numeric answers in few stereotyped shapes
    (ResearcherPolicy.plain_kind_answers)."""
    research_note_readings: bool = False
    """The reference notes the readings it counts before each answer after research
    (ResearcherPolicy.note_readings); every research turn then has at least
    `NOTE_TURN_TOKENS` tokens. Off: the 64 x 2 model learns the note's form but not its
    copy (0.39 of its notes name exactly its evidence, 0.79 of its answers parse; seed 0,
    docs/results.md, "Notes that spell out the reading")."""
    validation_fraction: float = 0.1
    """Share of the live questions the promotion gate holds out of every update and judges
    each candidate version on (FW_VALIDATION_FRACTION of the flows; 0 turns the gate off).
    The gate's validation set is the live world's questions; the panel is another matter."""
    research_gate_max_questions: int = 40
    """The promotion gate's sizes on the research world (FW_GATE_MAX_QUESTIONS, ..._UNRESOLVED,
    ..._TRAINED of the flows; research off, the flows' defaults: 200, 100, 40). The gate
    forecasts each of its questions with every candidate, 4 rollouts or more each, and a
    research rollout is three turns: at the one-turn demo's sizes its forecasts were the
    largest share of a research round's time (30% of the main thread, against 19% training;
    docs/results.md, "The research demo's gate sized for multi-turn rollouts, a 960-question
    panel and seed 1")."""
    research_gate_max_unresolved: int = 40
    research_gate_max_trained: int = 40
    report_to: ReportTo | None = None
    """Experiment tracker for every update's steps and summary and each round's panel scores
    (tensorboard, mlflow, wandb, none; flows.tracking); None: FW_REPORT_TO, else none."""
    train_set: tuple[str, ...] = ()
    """Training settings of every RL update as `name=value` (any TrainConfig field, as
    `futureworld train --set`), applied over the demo's own (`update`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_set", tuple(self.train_set))
        # One estimator for the updates and the sampling alike: train_set's, when it names one
        # (parsed as every --set is, so a bad value is a TrainConfigError naming it).
        given = TrainConfig(estimator=Estimator(self.estimator))
        estimator = config_with_overrides(given, sets=self.train_set).estimator
        object.__setattr__(self, "estimator", estimator)
        kinds = tuple(QuestionKind(k) for k in self.kinds)
        object.__setattr__(self, "kinds", kinds)
        if QuestionKind.BINARY not in kinds or len(set(kinds)) != len(kinds):
            raise ValueError(f"kinds must name binary and each kind once, got {list(kinds)}")
        if self.extra_kinds and (self.kind_questions_per_day < 1 or self.kind_panel_questions < 1):
            raise ValueError("kind_questions_per_day and kind_panel_questions must be >= 1")
        if self.rounds < 2:
            raise ValueError(f"the demo needs at least 2 rounds to compare, got {self.rounds}")
        if self.questions_per_day < 1 or self.samples < 2 or self.panel_questions < 1:
            raise ValueError("questions_per_day and panel_questions must be >= 1, samples >= 2")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.research and (self.research_max_turns < 3 or self.research_panel_questions < 1):
            raise ValueError("research needs max_turns >= 3 and research_panel_questions >= 1")
        if (
            self.research_round_panel_questions is not None
            and self.research_round_panel_questions < 1
        ):
            raise ValueError(
                "research_round_panel_questions must be >= 1 or None (the whole panel), got "
                f"{self.research_round_panel_questions}"
            )
        if (
            self.research_gate_max_questions < 1
            or min(self.research_gate_max_unresolved, self.research_gate_max_trained) < 0
        ):
            raise ValueError("research_gate_max_questions must be >= 1, the other sizes >= 0")
        self.researcher  # noqa: B018 — bad researcher rates fail here
        self.update  # noqa: B018 — a bad --set fails here, before the warm start

    def research_panel_head(self) -> int | None:
        """The research panel's head the per-round scores are of (research_round_panel_questions),
        None where that is the whole panel."""
        head = self.research_round_panel_questions
        return None if head is None or head >= self.research_panel_questions else head

    def research_round_scores_whole(self, round_no: int) -> bool:
        """Whether round `round_no` is scored on the whole research panel: the claim's rounds
        (the first and the last) always; every round where the head is the whole panel."""
        return self.research_panel_head() is None or round_no in (0, self.rounds - 1)

    @property
    def extra_kinds(self) -> tuple[QuestionKind, ...]:
        """The kinds besides binary, in `kinds` order."""
        return tuple(k for k in self.kinds if k is not QuestionKind.BINARY)

    def world_config(self, **values: object) -> WorldConfig:
        """A world posing this demo's kinds (a binary-only world is unchanged by kinds)."""
        from futureworld.world import WorldConfig

        per_day = self.kind_questions_per_day
        if self.research:
            values = {"n_entities": self.research_entities, **values}
        return WorldConfig(
            research=self.research,
            choice_questions_per_day=per_day if QuestionKind.CHOICE in self.kinds else 0,
            numeric_questions_per_day=per_day if QuestionKind.NUMERIC in self.kinds else 0,
            **values,  # type: ignore[arg-type]
        )

    @property
    def generation(self) -> GenerationSettings:
        """The learner's sampling: one brief turn, a short answer; on the research world
        `research_max_turns` brief turns of `research_max_new_tokens` each, with a belief
        elicited after each tool turn when the estimator credits turns by it."""
        if self.research:
            turn_tokens = self.research_max_new_tokens
            if self.extra_kinds:  # a choice or numeric answer is longer than a query
                turn_tokens = max(turn_tokens, self.kind_max_new_tokens)
            if self.research_note_readings:
                turn_tokens = max(turn_tokens, NOTE_TURN_TOKENS)
            return GenerationSettings(
                temperature=self.temperature,
                max_turns=self.research_max_turns,
                max_new_tokens=turn_tokens,
                max_total_tokens=1024,
                search_k=self.research_search_k,
                brief_prompt=True,
                elicit_beliefs=self.estimator.credits_turns,
                seed=self.seed,
            )
        return GenerationSettings(
            temperature=self.temperature,
            max_turns=1,
            max_new_tokens=self.kind_max_new_tokens if self.extra_kinds else 12,
            max_total_tokens=1024,
            brief_prompt=True,
            seed=self.seed,
        )

    @property
    def gate_sizes(self) -> dict[str, int | None]:
        """The promotion gate's sizes as Settings fields (FW_GATE_*): the research world's,
        else GateOptions' own (given, so a user's FW_GATE_* cannot change a demo's gate)."""
        from futureworld.validation import GateOptions

        gate = (
            GateOptions(
                max_questions=self.research_gate_max_questions,
                max_unresolved=self.research_gate_max_unresolved,
                max_trained=self.research_gate_max_trained,
            )
            if self.research
            else GateOptions()
        )
        return {
            "gate_max_questions": gate.max_questions,
            "gate_max_unresolved": gate.max_unresolved,
            "gate_max_trained": gate.max_trained,
        }

    @property
    def researcher(self) -> ResearcherPolicy:
        """The reference researcher the research warm start demonstrates."""
        from flows.demo.researcher import ResearcherPolicy

        return ResearcherPolicy(
            search_rate=self.research_search_rate,
            poor_query_rate=self.research_poor_query_rate,
            open_rate=self.research_open_rate,
            sharpening=self.research_sharpening,
            noise_logit=self.research_noise_logit,
            plain_kind_answers=self.research_plain_kind_answers,
            note_readings=self.research_note_readings,
        )

    @property
    def warm_start(self) -> TrainOptions:
        return TrainOptions(
            config=TrainConfig(
                estimator=Estimator.SFT,
                learning_rate=self.research_sft_learning_rate
                if self.research
                else self.sft_learning_rate,
                lr_decay=self.research and self.research_sft_lr_decay,
                ppo_epochs=self.research_sft_epochs if self.research else self.sft_epochs,
                micro_batch_tokens=2048,
                groups_per_step=self.research_sft_groups_per_step if self.research else 4,
                # the binary demo's warm start keeps the row-per-demonstration path its
                # seeded results were measured on
                pack_single_rollouts=self.research,
            )
        )

    @property
    def update(self) -> TrainOptions:
        """Each round's RL update: a group a packed row, `rl_groups_per_step` groups a step."""
        own_reward = {QuestionKind.CHOICE: RewardFn.RLCR, QuestionKind.NUMERIC: RewardFn.CRPS}
        demo = TrainConfig(
            estimator=self.estimator,
            learning_rate=self.research_rl_learning_rate
            if self.research
            else self.rl_learning_rate,
            micro_batch_tokens=2048,
            groups_per_step=self.rl_groups_per_step,
            temperature=self.temperature,
            kl_coef=self.rl_kl_coef,
        )
        return TrainOptions(
            config=config_with_overrides(demo, sets=self.train_set),
            min_groups=self.min_groups,
            kind_rewards=tuple(own_reward[k] for k in self.extra_kinds),
            kl_reference=WARM_START_VERSION,
            kl_trail=self.rl_kl_trail,
            draw_groups=self.rl_draw_groups,
            rejection_backoff=self.rl_rejection_backoff,
        )
