"""The fit's robust loss: a row that no parameter in range can explain pulls a shared parameter less than under
plain least squares, and rows the model can meet are met alike."""

import pytest

from blendsim.fidelity import fit as F
from blendsim.fidelity.suite import load_suite
from tests.test_fidelity import _row, _write


def _rows(outlier: float):
    # three A100 rows the presets price at their values (within 0.1%), and one with a measurement `outlier` x lower
    rows = [_row(id=f"a-{i}", source="doc A", hardware="a100-80gb", workload=w, requests=200, value=v)
            for i, (w, v) in enumerate((("const:512/256", 3250.0), ("const:1024/128", 1283.0), ("const:256/512", 5326.0)))]
    rows.append(_row(id="odd", source="doc B", hardware="a100-80gb", workload="const:512/256", requests=200,
                     value=3250.0 / outlier))
    return rows


@pytest.fixture(scope="module")
def suites(tmp_path_factory):
    return {k: load_suite(_write(tmp_path_factory.mktemp(f"c{k}"), _rows(k)), {}) for k in (1.0, 4.0)}


def _errors(suite, params):
    return {r.id: F.predict(r, pr, params) / r.value - 1 for r, pr in suite.ok}


def test_an_outlier_moves_the_robust_fit_less(suites):
    clean = F.fit(suites[1.0].ok)
    robust, plain = F.fit(suites[4.0].ok), F.fit(suites[4.0].ok, loss="linear")
    shift = {name: {k: abs(out["arch"]["ampere"][k] - clean["arch"]["ampere"][k]) for k in ("gemm_eff", "mem_eff")}
             for name, out in (("robust", robust), ("plain", plain))}
    assert sum(shift["robust"].values()) < sum(shift["plain"].values())
    # the three consistent rows stay closer to their measurements under the robust fit
    er, ep = _errors(suites[4.0], robust), _errors(suites[4.0], plain)
    assert max(abs(er[f"a-{i}"]) for i in range(3)) < max(abs(ep[f"a-{i}"]) for i in range(3))


def test_the_shipped_fit_uses_the_robust_loss(suites):
    assert F.LOSS == "soft_l1" and 0 < F.F_SCALE < 1
    # the default is the robust loss: it differs from plain least squares where an outlier is present
    assert F.fit(suites[4.0].ok) != F.fit(suites[4.0].ok, loss="linear")
