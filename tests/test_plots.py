"""Figures with many series stay readable: styles never repeat, group names never overlap."""
from relpos_lab.records.plots import curves_figure, groups_figure

SCHEMES = ["none", "sinusoidal", "learned", "shaw-k1", "shaw-k2", "shaw-k4", "shaw-k16", "shaw+sin", "rope",
           "alibi", "t5_bias", "transformer_xl", "fire", "randomized-rope", "randomized-shaw"]


def test_fifteen_curves_each_have_their_own_colour_and_line_style():
    fig = curves_figure({name: {1: 0.1 * i, 2: 0.05 * i} for i, name in enumerate(SCHEMES)})
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in SCHEMES]
    looks = {(line.get_color(), line.get_linestyle(), line.get_marker()) for line in lines}
    assert len(lines) == len(looks) == 15


def test_fifteen_group_names_do_not_overlap():
    fig = groups_figure({"exact_match": {name: [0.5, 0.6] for name in SCHEMES},
                         "token_accuracy": {name: [0.7, 0.8] for name in SCHEMES}})
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        assert len(boxes) == 15
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
