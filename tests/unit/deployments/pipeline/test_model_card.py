"""A model application's card and the version guard between its stages (real tiny models, no Ray)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from contracts.errors import InvalidRequestError, UnavailableError
from contracts.outputs import ModelOutput
from contracts.tokenized import TokenizeJob
from deployments.config import ModelConfig, ObservabilityConfig, RuntimeConfig
from deployments.pipeline.inference import InferenceDeployment
from deployments.pipeline.model import ModelDeployment, ServedVersion
from deployments.repository.manifest import ResolvedModel
from deployments.repository.resolve import resolve_model
from preprocess.tokenize import TextTokenizer
from tests.support.models import build_classifier


@pytest.fixture(scope="module")
def versions(tmp_path_factory: pytest.TempPathFactory) -> list[ResolvedModel]:
    repo = tmp_path_factory.mktemp("models")
    build_classifier(repo, version="1")
    build_classifier(repo, version="2")
    base = ModelConfig(repository=str(repo), name="tiny-sentiment", task="classify", precision="fp32")
    return [resolve_model(base.model_copy(update={"version": v})) for v in ("1", "2")]


def _card_deployment(models: list[ResolvedModel]) -> ModelDeployment:
    served = [ServedVersion(model=m, tokenizer=None, inference=None) for m in models]
    return ModelDeployment.func_or_class(served, None, ObservabilityConfig())


def test_card_lists_stable_then_candidate_with_the_configured_share(versions):
    deployment = _card_deployment(versions)
    card = deployment.card()
    assert (card.name, card.versions) == ("tiny-sentiment", ["1", "2"])
    assert [(lane.role, lane.share) for lane in card.lanes] == [("stable", 1.0), ("candidate", 0.0)]
    assert card.stable.labels == ("negative", "neutral", "positive") and card.stable.max_tokens == 128
    deployment.reconfigure({"candidate_share": 0.3})
    assert [lane.share for lane in deployment.card().lanes] == pytest.approx([0.7, 0.3])


def test_without_a_candidate_the_share_is_ignored(versions):
    deployment = _card_deployment(versions[:1])
    deployment.reconfigure({"candidate_share": 0.5})
    card = deployment.card()
    assert card.candidate is None and card.stable.share == 1.0


def test_card_share_is_validated(versions):
    with pytest.raises(ValueError, match="candidate_share"):
        _card_deployment(versions).reconfigure({"candidate_share": 1.5})


def test_a_version_the_pipeline_no_longer_serves_is_a_404(versions):
    """The router's card can predate a rollout by a second: a pin to a version gone is answered, not lost."""
    from contracts.errors import ModelNotFoundError
    from contracts.outputs import ResponseOptions
    from deployments.pipeline.request_group import PipelineJob

    deployment = _card_deployment(versions[:1])
    jobs = [PipelineJob(TokenizeJob(["x"]), ResponseOptions(route="predict"), version="9")]
    (answer,) = asyncio.run(deployment._through_stages(jobs, "9"))
    assert isinstance(answer, ModelNotFoundError) and "'9'" in str(answer) and "['1']" in str(answer)


@pytest.mark.parametrize(
    ("served", "card_version", "role", "pinned", "expected"),
    [
        (["2"], "1", "stable", False, "2"),  # the card predates a v1 -> v2 roll: the stable version now
        (["2", "3"], "1", "candidate", False, "3"),  # ... and the candidate's role goes to the candidate
        (["2"], "1", "candidate", False, "2"),  # a candidate gone since: its requests go to stable
        (["1", "2"], "1", "stable", False, "1"),  # a served version is kept as it is
        (["2"], "1", "stable", True, "1"),  # a pin never moves (and is then a 404 naming what is served)
    ],
)
def test_an_unpinned_request_follows_its_role_across_a_rollout(
    tmp_path_factory, served, card_version, role, pinned, expected
):
    from contracts.outputs import ResponseOptions
    from deployments.pipeline.request_group import ModelRequest

    repo = tmp_path_factory.mktemp("roll")
    base = ModelConfig(repository=str(repo), name="tiny-sentiment", task="classify", precision="fp32")
    models = []
    for version in served:
        build_classifier(repo, version=version)
        models.append(resolve_model(base.model_copy(update={"version": version})))
    request = ModelRequest(TokenizeJob(["x"]), ResponseOptions(route="predict"), card_version, role, pinned)
    assert _card_deployment(models)._version_for(request) == expected


def _encode(model: ResolvedModel, text: str):
    tokenizer = TextTokenizer(model.tokenizer_file, model.manifest.input.max_tokens)
    return tokenizer.encode(TokenizeJob([text]).texts, False)


def test_inference_refuses_ids_made_by_another_tokenizer(versions, serve_batch_queue):
    """During a rolling update one version's tokenizer may meet the other's model: never run those ids."""
    model = versions[0]
    inference = InferenceDeployment.func_or_class(model, "cpu", RuntimeConfig(), ObservabilityConfig())
    batched = []
    run = inference._run_on_model_thread

    def on_model(groups):  # what reaches the model is the point here
        batched.extend(groups)
        return run(groups)

    inference._run_on_model_thread = on_model
    encoded = dataclasses.replace(_encode(model, "a fine day"), tokenizer_id=model.tokenizer_id)
    foreign = dataclasses.replace(encoded, tokenizer_id="another-tokenizer")
    error = InvalidRequestError("bad input")  # an earlier stage's error passes through untouched
    mine, refused, passed = asyncio.run(inference.infer([encoded, foreign, error], "batch", 0.4))
    assert inference._gate.scheduler.policy.batch_min_share == 0.4  # the pipeline's setting, as it sent it
    assert isinstance(mine, ModelOutput) and mine.token_count == encoded.token_count and passed is error
    assert isinstance(refused, UnavailableError) and "changing versions" in str(refused)
    assert batched[0][0] is encoded and isinstance(batched[0][1], UnavailableError)
