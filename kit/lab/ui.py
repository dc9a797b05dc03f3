"""What the four panels share: controls laid out in columns, HTML tables and lines, figures as PNG.

The forms are columns of one width (``CELL``) with every label ``DESCRIPTION_WIDTH`` wide; numbers carry
units and separators; an invalid choice shows one line (``one_line``: ``kit.schema.one_line_error``'s) in red
instead of a traceback; every control has a tooltip (``tip``: a setting's help, or the panel's ``TIPS``)
and the configuration labels shown come with their legend (``legend_html``). Nothing here builds a Setup:
the panels (``memory_panel``, ``comparison_panel``, ``plan_panel``, ``monitor_panel``) build them and call
``kit``.
"""

from __future__ import annotations

import html
import io
import re
from collections.abc import Sequence

import ipywidgets as w
from IPython.display import Image, clear_output, display
from pydantic import ValidationError

from kit.schema import one_line_error
from kit.units import MIB, number

#: the errors a panel shows as one line (an invalid Setup, a bad value, a file that is not there)
ERRORS = (ValidationError, ValueError, OSError)
#: bucket sliders span 1e4 .. 1e10 elements on a log scale (DeepSpeed's defaults are 5e7 .. 1e9).
BUCKET_MIN_EXP, BUCKET_MAX_EXP = 4, 10
#: room for the longest control label ("offload optimizer") so none is cut off; every label of a panel
#: has this width, so that the labels line up in columns
DESCRIPTION_WIDTH = "115px"
#: the width of one control, its label included: the forms are columns of this width
CELL = "265px"
#: a slider's width: two to a row, with room for the track
SLIDER = "400px"
#: a text box holding a line of figures ("your GPU"): two columns, so its example is read whole
FIGURES = "530px"
#: a toggle button's width: per character of its longest option (13px font), and its padding and border
TOGGLE_CHAR_PX, TOGGLE_PAD_PX = 8, 30
#: the verdict line: large enough to be read first
VERDICT_STYLE = "font-size:1.25em;margin:6px 0;"
#: the colours of a problem and of a success
RED, GREEN = "#b00", "#1a7f37"
#: the controls whose ipywidgets 8 view shows ``tooltip`` only when they have no label (``tip``)
UNTITLED = (w.Text, w.Textarea, w.Checkbox, w.Select, w.SelectMultiple)


def one_line(error: BaseException) -> str:
    """The one line a panel shows for ``error`` (``kit.schema.one_line_error`` for a validation error)."""
    if isinstance(error, ValidationError | ValueError):
        return one_line_error(error)
    if isinstance(error, OSError) and error.filename:
        return f"config.json: {error.filename}: {error.strerror}"
    return str(error).splitlines()[0]


def colored(text: str, color: str = RED) -> str:
    """``text`` escaped, in ``color`` (red: a problem)."""
    return f"<span style='color:{color}'>{html.escape(text)}</span>"


#: a ``table_html`` format: the number as ``kit.units.number`` writes it (at most four significant digits)
NUMBER = "number"


def table_html(
    header: Sequence[str], rows: Sequence[Sequence], formats: Sequence[str], bold_rows: Sequence[int] = ()
) -> str:
    """A compact HTML table: numbers right-aligned in ``formats`` (a format string, or ``NUMBER``; missing
    ones as a dash), labels on one
    line, only the last (free-text) column wrapping; a header wraps between its words, so that a table of
    many columns stays as wide as its numbers (the comparison table's last column was cut)."""
    cell_style = "padding:2px 7px;border-bottom:1px solid #e4e4e4;"
    head = "".join(
        f"<th style='{cell_style}text-align:{'left' if f == '{}' else 'right'};white-space:normal;"
        "vertical-align:bottom'>"
        f"{html.escape(h)}</th>"
        for h, f in zip(header, formats, strict=True)
    )
    body = []
    for i, values in enumerate(rows):
        cells = []
        for j, (value, fmt) in enumerate(zip(values, formats, strict=True)):
            text = "&ndash;" if _missing(value) else html.escape(_formatted(value, fmt))
            wrap = "normal" if j == len(values) - 1 and fmt == "{}" and j > 0 else "nowrap"
            align = "left" if fmt == "{}" else "right"
            weight = "font-weight:bold;" if i in bold_rows else ""
            cells.append(f"<td style='{cell_style}{weight}text-align:{align};white-space:{wrap}'>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        "<table class='zk-html-table' style='border-collapse:collapse;font-size:12px;"
        "font-variant-numeric:tabular-nums;margin:4px 0'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def facts_html(facts: list[tuple[str, str]]) -> str:
    """Two columns of (name, HTML value) pairs, the names grey; a long value wraps within 250 px (the
    panels set the table beside a chart)."""
    rows = "".join(
        f"<tr><td style='color:#666;padding:1px 10px 1px 0;white-space:nowrap;vertical-align:top'>{k}</td>"
        f"<td style='padding:1px 0;max-width:250px'>{v}</td></tr>"
        for k, v in facts
    )
    return f"<table style='font-size:13px;margin-left:12px'>{rows}</table>"


def strip_tags(text: str) -> str:
    """An HTML line as plain text (tags removed, entities kept)."""
    return re.sub(r"<[^>]+>", "", text)


def mib(nbytes: int | None) -> float | None:
    """Bytes in MiB (None stays None: a table shows it as a dash)."""
    return None if nbytes is None else nbytes / MIB


def figure_png(fig, dpi: int = 100) -> bytes:
    """``fig`` (a Figure outside pyplot's state) as PNG bytes, for an ``ipywidgets.Image``; cropped to
    what it draws unless a layout engine already placed everything (cropping draws the figure twice)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches=None if fig.get_layout_engine() else "tight")
    return buffer.getvalue()


def show_figure(output: w.Output, fig, clear: bool = True) -> None:
    """Show ``fig`` as a PNG in ``output``, whatever the notebook's matplotlib backend."""
    with output:
        if clear:
            clear_output(wait=True)
        display(Image(figure_png(fig, dpi=80)))


def toggle(options, value, description: str, button_width: str | None = None) -> w.ToggleButtons:
    """Toggle buttons with their label inline, as every other control's (ipywidgets puts it above), each
    button ``button_width`` wide (default: room for the longest option; 56px cut "nvme" to "nv...")."""
    labels = [str(o[0] if isinstance(o, tuple) else o) for o in options]
    width = button_width or f"{max(len(label) for label in labels) * TOGGLE_CHAR_PX + TOGGLE_PAD_PX}px"
    buttons = w.ToggleButtons(
        options=options,
        value=value,
        description=description,
        style={"description_width": DESCRIPTION_WIDTH, "button_width": width},
    )
    buttons.add_class("widget-inline-hbox")
    return buttons


def checkpointing(zero) -> w.Dropdown:
    """Activation checkpointing's choices (``kit.checkpointing.choices``), set to ``zero``'s; its value
    is the ZeroSettings fields' values (``dict(zip(kit.checkpointing.FIELDS, value))``)."""
    from kit import checkpointing as policies

    options = policies.choices(zero)
    value = tuple(getattr(zero, field) for field in policies.FIELDS)
    return w.Dropdown(options=options, value=value, description="checkpointing")


def trainable(zero, model=None) -> w.Dropdown:
    """What trains (``kit.trainable.choices``: those ``model`` takes, when given), set to ``zero``'s; its
    value is the ZeroSettings fields' values (``dict(zip(kit.trainable.FIELDS, value))``)."""
    from kit import trainable as subsets

    options = subsets.choices(zero, model)
    return w.Dropdown(
        options=options, value=subsets.key(zero), description="trains", disabled=len(options) < 2
    )


def loss(zero, model=None) -> w.Dropdown:
    """The loss (``kit.loss.choices``: those ``model`` takes, when given), set to ``zero``'s; its value is
    ``ZeroSettings.loss``."""
    from kit import loss as losses

    options = losses.choices(zero, model)
    return w.Dropdown(options=options, value=zero.loss, description="loss", disabled=len(options) < 2)


def control(setting, zero, model=None) -> w.ValueWidget:
    """The panels' control of one ``kit.settings.Setting`` (a composite's for its group), set to ``zero``'s
    value, its tooltip the setting's help (a composite's: each field's); its ``value`` is what
    ``setting_values`` reads back."""
    from kit import settings

    helps = [f"{s.label}: {s.help}" for s in settings.group(setting.group)] if setting.group else []
    return tip(_control(setting, zero, model), "; ".join(helps) or setting.help)


def _control(setting, zero, model=None) -> w.ValueWidget:
    from kit.ds_keys import EXAMPLE_NVME_PATH

    s, value = setting, setting.value(zero)
    if s.group == "checkpointing":
        return checkpointing(zero)
    if s.group == "trainable":
        return trainable(zero, model)
    if s.field == "loss":
        return loss(zero, model)
    if s.field == "overlap_comm":  # None would show an empty dropdown: its choices are words
        options = [("default", "default"), ("on", "on"), ("off", "off")]  # DeepSpeed's: stage 3 only
        shown = "default" if value is None else "on" if value else "off"
        return w.Dropdown(options=options, value=shown, description=s.label)
    if s.control == "toggle":
        return toggle(list(s.choices), value, s.label)
    if s.control == "dropdown":
        return w.Dropdown(options=list(s.choices), value=value, description=s.label)
    if s.control == "checkbox":
        return w.Checkbox(value=value, description=s.label)
    if s.control == "elements":
        return bucket_slider(s.label, value)
    if s.control == "text":
        return w.Text(value=value or EXAMPLE_NVME_PATH, description=s.label)
    low, high = s.bounds
    if s.control == "float":  # the schema's bound is exclusive (momentum < 1)
        return w.BoundedFloatText(value=value, min=low, max=0.999, step=0.01, description=s.label)
    return w.BoundedIntText(value=value, min=low, max=high or 1 << 30, description=s.label)


def setting_values(setting, widget: w.ValueWidget) -> dict:
    """``{field: value}`` a control gives (``control``): a composite's several fields, a slider's count
    rounded, an empty text None."""
    from kit import settings

    if setting.group:
        return dict(zip((s.field for s in settings.group(setting.group)), widget.value, strict=True))
    if setting.control == "elements":
        return {setting.field: round(widget.value)}
    if setting.control == "text":
        return {setting.field: widget.value.strip() or None}
    if setting.field == "overlap_comm":
        return {setting.field: None if widget.value == "default" else widget.value == "on"}
    return {setting.field: widget.value}


def tip(control: w.DOMWidget, text: str) -> w.DOMWidget:
    """``control`` with ``text`` as its tooltip (``tooltip``: ipywidgets 8 shows it as the title of the
    control's label, of a button, or of a control without a label). A text box, a checkbox or a list
    with a label shows none (their views title only the input, and only without a label): their label
    carries it instead, as a titled span."""
    control.tooltip = text
    if isinstance(control, UNTITLED) and control.description and not control.description_allow_html:
        title = html.escape(text, quote=True)
        control.description = f"<span title='{title}'>{html.escape(control.description)}</span>"
        control.description_allow_html = True
    return control


def tips(panel: object, texts: dict[str, str]) -> None:
    """Each of ``panel``'s controls named in ``texts`` (an attribute of it) with its tooltip (``tip``)."""
    for name, text in texts.items():
        tip(getattr(panel, name), text)


def legend_html(labels) -> str:
    """What the tokens of some configuration labels mean (``kit.labels.label_legend``: labels or Setups),
    one small grey paragraph; "" for none."""
    from kit.labels import label_legend

    legend = label_legend(labels)
    if not legend:
        return ""
    items = " &middot; ".join(f"<code>{html.escape(t)}</code> {html.escape(m)}" for t, m in legend.items())
    return f"<div class='zk-legend' style='color:#666;font-size:11px;margin:2px 0 6px'>{items}</div>"


def button(description: str, icon: str, **options) -> w.Button:
    """A button as wide as its label (ipywidgets' fixed width cuts long labels off)."""
    return w.Button(
        description=description, icon=icon, layout=w.Layout(width="auto", min_width="90px"), **options
    )


def bucket_slider(description: str, value: int) -> w.FloatLogSlider:
    """A log slider of elements from 1e4 to 1e10 (``value`` clipped into that range)."""
    value = min(max(value, 10**BUCKET_MIN_EXP), 10**BUCKET_MAX_EXP)
    return w.FloatLogSlider(
        value=value,
        base=10,
        min=BUCKET_MIN_EXP,
        max=BUCKET_MAX_EXP,
        step=0.1,
        description=description,
        readout_format=".3s",
        continuous_update=False,
    )


def cell(control: w.Widget) -> w.Widget:
    """``control`` one column wide (a slider wider), its label ``DESCRIPTION_WIDTH`` wide."""
    control.style.description_width = DESCRIPTION_WIDTH
    if isinstance(control, w.FloatLogSlider):
        control.layout.width = SLIDER
    elif not isinstance(control, w.ToggleButtons):
        control.layout.width = CELL
    return control


def rows(controls: list[w.Widget], width: int = 700) -> list[w.HBox]:
    """``controls`` in rows of at most ``width`` px, in order (a slider is ``SLIDER`` wide, others
    ``CELL``), so no row wraps inside a narrower box."""
    out: list[list[w.Widget]] = []
    used = width
    for control in controls:
        wide = int((SLIDER if isinstance(control, w.FloatLogSlider) else CELL).removesuffix("px"))
        if used + wide > width:
            out.append([])
            used = 0
        out[-1].append(control)
        used += wide
    return [row(*line) for line in out]


def row(*controls: w.Widget) -> w.HBox:
    """Controls side by side, wrapping onto the next line when the notebook is narrow."""
    return w.HBox(
        list(controls), layout=w.Layout(flex_flow="row wrap", align_items="center", grid_gap="4px 12px")
    )


def section(title: str) -> w.HTML:
    """A small upper-case heading with a rule under it."""
    return w.HTML(
        f"<div style='margin:8px 0 2px;color:#555;font-size:11px;font-weight:bold;letter-spacing:.06em;"
        f"text-transform:uppercase;border-bottom:1px solid #ddd'>{html.escape(title)}</div>",
        layout=w.Layout(width="100%"),
    )


def _formatted(value, fmt: str) -> str:
    return number(value) if fmt == NUMBER else fmt.format(value)


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)
