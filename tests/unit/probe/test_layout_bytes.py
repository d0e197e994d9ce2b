"""The probe file's bytes do not move: today's writer packs, and reader decodes, the images of the
layout code the field table replaced (``layout_bytes.py``'s fixtures), for every version and flag."""

from __future__ import annotations

import json

import pytest

from dam_probe.layout import decode, encode

from .layout_bytes import FIXTURE, records

IMAGES: dict[str, str] = json.loads(FIXTURE.read_text())
CASES = records()


def test_every_case_has_a_fixture_image() -> None:
    assert sorted(CASES) == sorted(IMAGES)


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_writer_packs_the_bytes_of_the_old_layout(name: str) -> None:
    assert encode(CASES[name], 6).hex() == IMAGES[name]


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_the_old_bytes_decode_to_the_record_they_were_packed_from(name: str) -> None:
    assert decode(bytes.fromhex(IMAGES[name])) == (6, CASES[name])
