"""The row fragment tags write what the template filters they replaced wrote."""

import random

from django.template.defaultfilters import floatformat
from django.urls import reverse

from core.templatetags.ui import fixed, meter, url_prefix


def test_fixed_rounds_as_floatformat_does():
    values = [0, 0.05, 0.04, 12.5, 66.25, 84.95, 99.95, 100, *(random.uniform(0, 100) for _ in range(2000))]
    for value in values:
        assert fixed(value, 0) == floatformat(value, 0)
        assert fixed(value, 1) == floatformat(value, "1u")


def test_meter_takes_the_string_widthratio_gives_and_colours_high_values():
    assert "meter--crit" in meter("96", warn=True) and 'style="width: 96.0%"' in meter("96", warn=True)
    assert "meter--high" in meter(85, warn=True) and "meter--" not in meter(85)
    assert "Not reported" in meter(None)


def test_url_prefix_and_an_id_make_the_objects_url():
    assert f"{url_prefix('console:node_detail')}42/" == reverse("console:node_detail", args=[42])
