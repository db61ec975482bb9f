//! Drawing helpers of the report: escaping, linear scales, axis ticks and
//! labels with units, number formatting.
//!
//! Conventions: coordinates are written with one decimal (a tenth of a
//! pixel), which keeps large plans' pages small; every string that may come
//! from a model, a trace or a cluster file goes through `esc` before it is
//! written into the page (text or attribute).

use std::fmt::Write;

/// `s` with the five XML-special characters replaced by character
/// references: safe in element text and in double- or single-quoted
/// attributes.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0 text.
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A linear map from a data interval onto a pixel interval.
#[derive(Copy, Clone, Debug)]
pub struct Scale {
    pub d0: f64,
    pub d1: f64,
    pub r0: f64,
    pub r1: f64,
}

impl Scale {
    /// Maps `[d0, d1]` onto `[r0, r1]`; an empty data interval is widened
    /// to `[d0, d0 + 1]` so that nothing divides by zero.
    pub fn new(d0: f64, d1: f64, r0: f64, r1: f64) -> Scale {
        let d1 = if d1 > d0 && d1.is_finite() {
            d1
        } else {
            d0 + 1.0
        };
        Scale { d0, d1, r0, r1 }
    }

    /// The pixel of data value `v`.
    pub fn px(&self, v: f64) -> f64 {
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }

    /// Pixels per data unit (absolute).
    pub fn density(&self) -> f64 {
        ((self.r1 - self.r0) / (self.d1 - self.d0)).abs()
    }
}

/// Up to about `n` round tick values (1, 2 or 5 times a power of ten)
/// from 0 to `max`.
pub fn ticks(max: f64, n: usize) -> Vec<f64> {
    if !(max > 0.0 && max.is_finite()) {
        return vec![0.0];
    }
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    (0..)
        .map(|k| k as f64 * step)
        .take_while(|v| *v <= max * (1.0 + 1e-9))
        .collect()
}

/// A unit for an axis: the divisor and its name.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Unit {
    pub div: f64,
    pub name: &'static str,
}

/// The time unit (s, ms or µs) that shows `max_s` seconds with at most
/// three integer digits.
pub fn time_unit(max_s: f64) -> Unit {
    match max_s {
        m if m >= 1.0 => Unit {
            div: 1.0,
            name: "s",
        },
        m if m >= 1e-3 => Unit {
            div: 1e-3,
            name: "ms",
        },
        _ => Unit {
            div: 1e-6,
            name: "µs",
        },
    }
}

/// The binary byte unit (B, KiB, MiB, GiB, TiB) that shows `max` bytes.
pub fn byte_unit(max: f64) -> Unit {
    const UNITS: [(&str, f64); 5] = [
        ("TiB", 1099511627776.0),
        ("GiB", 1073741824.0),
        ("MiB", 1048576.0),
        ("KiB", 1024.0),
        ("B", 1.0),
    ];
    UNITS.iter().find(|(_, d)| max >= *d).map_or(
        Unit {
            div: 1.0,
            name: "B",
        },
        |&(name, div)| Unit { div, name },
    )
}

/// `v` (already divided by its unit) with as few decimals as a tick needs.
pub fn tick_label(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else if (v * 10.0) == (v * 10.0).round() {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Seconds in a readable unit: `1.234 s`, `12.3 ms`, `45.6 µs`.
pub fn secs(s: f64) -> String {
    let u = time_unit(s.abs());
    format!("{:.3} {}", s / u.div, u.name)
}

/// Writes a horizontal axis at `y` for scale `x` (data in seconds), with
/// tick labels in `unit` and a title below.
pub fn time_axis(out: &mut String, x: &Scale, y: f64, max_s: f64, title: &str) {
    let unit = time_unit(max_s);
    let _ = write!(
        out,
        r#"<line class="axis" x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/>"#,
        x.r0, x.r1
    );
    for t in ticks(max_s / unit.div, 10) {
        let px = x.px(t * unit.div);
        let _ = write!(
            out,
            r#"<line class="tick" x1="{px:.1}" y1="{y:.1}" x2="{px:.1}" y2="{:.1}"/><text class="tl" x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            y + 5.0,
            y + 17.0,
            tick_label(t)
        );
    }
    let _ = write!(
        out,
        r#"<text class="at" x="{:.1}" y="{:.1}" text-anchor="middle">{} ({})</text>"#,
        (x.r0 + x.r1) / 2.0,
        y + 34.0,
        esc(title),
        unit.name
    );
}

/// Writes a vertical byte axis at `x0` for scale `y`, with horizontal grid
/// lines to `x1`, labels in a binary unit and a rotated title.
pub fn byte_axis(out: &mut String, y: &Scale, x0: f64, x1: f64, max: f64, title: &str) {
    let unit = byte_unit(max);
    let _ = write!(
        out,
        r#"<line class="axis" x1="{x0:.1}" y1="{:.1}" x2="{x0:.1}" y2="{:.1}"/>"#,
        y.r0, y.r1
    );
    for v in ticks(max / unit.div, 6) {
        let py = y.px(v * unit.div);
        let _ = write!(
            out,
            r#"<line class="grid" x1="{x0:.1}" y1="{py:.1}" x2="{x1:.1}" y2="{py:.1}"/><text class="tl" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            x0 - 6.0,
            py + 4.0,
            tick_label(v)
        );
    }
    let (tx, ty) = (x0 - 52.0, (y.r0 + y.r1) / 2.0);
    let _ = write!(
        out,
        r#"<text class="at" x="{tx:.1}" y="{ty:.1}" text-anchor="middle" transform="rotate(-90 {tx:.1} {ty:.1})">{} ({})</text>"#,
        esc(title),
        unit.name
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_quotes() {
        assert_eq!(
            esc(r#"<a href="x">&'b'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;b&#39;&lt;/a&gt;"
        );
        assert_eq!(esc("a\u{1}b"), "a\u{fffd}b");
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(ticks(0.0, 5), vec![0.0]);
        let t = ticks(7.3, 10);
        assert_eq!(t.last().copied(), Some(7.0));
        assert_eq!(time_unit(0.02).name, "ms");
        assert_eq!(byte_unit(3.0 * 1073741824.0).name, "GiB");
        assert_eq!(byte_unit(0.0).name, "B");
        let s = Scale::new(0.0, 0.0, 10.0, 20.0);
        assert_eq!(s.px(0.5), 15.0);
    }
}
