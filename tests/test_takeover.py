"""How a generation is continued elsewhere (``app.takeover``): its spec survives the audit record."""

from __future__ import annotations

import json

from app.engines.protocol import Sampling
from app.takeover import GenerationSpec


def test_a_generation_spec_round_trips_with_its_sampling_and_penalties() -> None:
    spec = GenerationSpec(
        sampling=Sampling(
            max_tokens=9,
            temperature=0.5,
            top_p=0.9,
            seed=7,
            presence_penalty=1.5,
            frequency_penalty=-0.25,
            stop_token_ids=(200002, 200012),
        ),
        custom_tools=("apply_patch",),
        prefill=(1, 2),
        function_names={"crm_lookup": ("crm", "lookup")},
        forced_call=True,
        encrypt_reasoning=False,
    )
    again = GenerationSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert again == spec


def test_a_spec_recorded_before_the_penalties_reads_as_none() -> None:
    data = GenerationSpec(
        sampling=Sampling(),
        custom_tools=(),
        prefill=(),
        function_names={},
        forced_call=False,
        encrypt_reasoning=False,
    ).to_json()
    del data["sampling"]["presence_penalty"], data["sampling"]["frequency_penalty"]
    sampling = GenerationSpec.from_json(data).sampling
    assert sampling.presence_penalty is None and sampling.frequency_penalty is None
