//! The files: the JSON of every figure and target, and the SVG plot of the
//! throughput ratios.

use std::fmt::Write as _;

use crate::measure::{Case, Results, Settings};
use crate::report::{kind_name, tput_ratio, About, Target};
use crate::{EVENT, POOL_BASELINES, SIZES, STICKY, STREAM};

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A measured case's members of a JSON object: its operation, variant and
/// thread count.
fn json_case(c: &Case) -> [(&'static str, String); 3] {
    [
        ("operation", json_str(c.op)),
        ("variant", json_str(c.variant)),
        ("threads", c.threads.to_string()),
    ]
}

fn json_num(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.6}"),
        _ => "null".into(),
    }
}

/// A JSON object on one line, `{"key": value, ...}`, from its members in
/// order; each value is JSON text already (`json_str`, `json_num`, ...).
fn json_object(members: impl IntoIterator<Item = (&'static str, String)>) -> String {
    let members: Vec<String> = members
        .into_iter()
        .map(|(key, value)| format!("{}: {value}", json_str(key)))
        .collect();
    format!("{{{}}}", members.join(", "))
}

/// Writes the top-level JSON member `"name": value`, then `after` (the comma
/// before the next member, or nothing) and a newline.
fn json_member(o: &mut String, name: &str, after: &str, value: &str) {
    let _ = writeln!(o, "  {}: {value}{after}", json_str(name));
}

/// Writes the JSON member `"name": [...]` with `json_member`, one object a
/// line (`item` gives each object's members).
fn json_array<T, M>(
    o: &mut String,
    name: &str,
    after: &str,
    items: impl IntoIterator<Item = T>,
    item: impl Fn(T) -> M,
) where
    M: IntoIterator<Item = (&'static str, String)>,
{
    let rows: Vec<String> = items
        .into_iter()
        .map(|t| format!("    {}", json_object(item(t))))
        .collect();
    json_member(o, name, after, &format!("[\n{}\n  ]", rows.join(",\n")));
}

pub(crate) fn to_json(r: &Results, s: &Settings, a: &About, targets: &[Target]) -> String {
    let mut o = String::from("{\n");
    let machine = json_object([
        ("backend", json_str(&a.backend)),
        ("cpu", json_str(&a.cpu)),
        ("cores", s.cores.to_string()),
        ("load_average", json_str(&a.load)),
    ]);
    json_member(&mut o, "machine", ",", &machine);
    let run = json_object([
        ("date", json_str(&a.date)),
        ("commit", json_str(&a.commit)),
        ("arguments", json_str(&a.command)),
        ("quick", s.quick.to_string()),
        ("repeats", s.repeats().to_string()),
        ("target_ms", s.target.as_millis().to_string()),
        ("threads", format!("{:?}", s.threads)),
        ("oversubscribed_threads", s.oversubscribed().to_string()),
    ]);
    json_member(&mut o, "run", ",", &run);
    json_array(&mut o, "throughput", ",", &r.throughput, |t| {
        json_case(&t.case).into_iter().chain([
            ("ns_per_op", json_num(Some(t.ns_per_op))),
            ("mops", json_num(Some(t.mops))),
            ("ops_per_thread", t.n.to_string()),
        ])
    });
    json_array(&mut o, "latency", ",", &r.latency, |l| {
        json_case(&l.case).into_iter().chain([
            ("p50_ns", json_num(Some(l.p50))),
            ("p99_ns", json_num(Some(l.p99))),
            ("p999_ns", json_num(Some(l.p999))),
            ("samples", l.samples.to_string()),
        ])
    });
    json_array(&mut o, "scratch", ",", &r.rounds, |x| {
        [
            ("kind", json_str(kind_name(x.kind))),
            ("variant", json_str(x.variant.name())),
            ("allocations", SIZES.len().to_string()),
            ("ns_per_round", json_num(Some(x.ns_per_round))),
            (
                "ns_per_allocation",
                json_num(Some(x.ns_per_round / SIZES.len() as f64)),
            ),
            ("rounds", x.rounds.to_string()),
        ]
    });
    json_array(&mut o, "scratch_threads", ",", &r.thread_rounds.rows, |x| {
        [
            ("kind", json_str(kind_name(x.kind))),
            ("variant", json_str(x.variant.name())),
            ("threads", x.threads.to_string()),
            ("ns_per_round", json_num(Some(x.ns_per_round))),
            (
                "driver_allocations_per_round",
                json_num(x.driver_allocations_per_round),
            ),
            ("rounds_per_thread", x.rounds.to_string()),
        ]
    });
    let control = &r.thread_rounds.control;
    json_array(
        &mut o,
        "scratch_threads_control",
        ",",
        control,
        |&(threads, ns)| {
            [
                ("threads", threads.to_string()),
                ("ns_per_round", json_num(Some(ns))),
            ]
        },
    );
    json_array(&mut o, "targets", "", targets, |t| {
        [
            ("target", json_str(&t.what)),
            ("measured", json_num(t.measured)),
            ("comparison", json_str(if t.at_most { "<=" } else { ">=" })),
            ("limit", json_num(Some(t.limit))),
            ("met", t.met().map_or("null".into(), |m| m.to_string())),
        ]
    });
    o.push_str("}\n");
    o
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One SVG: per operation, bars of gpupool's throughput ratio against each
/// baseline at each thread count, on a log scale around 1×.
pub(crate) fn to_svg(r: &Results, s: &Settings, a: &About) -> String {
    const COLORS: [&str; 3] = ["#d62728", "#1f77b4", "#7f7f7f"];
    let ops = [EVENT, STREAM, STICKY];
    let (panel_w, panel_h, top, left, bottom) = (330.0, 300.0, 70.0, 60.0, 60.0);
    let width = left + panel_w * ops.len() as f64 + 20.0;
    let height = top + panel_h + bottom;
    let ratios: Vec<f64> = ops
        .iter()
        .flat_map(|&op| {
            s.threads.iter().flat_map(move |&t| {
                POOL_BASELINES
                    .iter()
                    .filter_map(move |&b| tput_ratio(r, op, b, t))
            })
        })
        .filter(|x| x.is_finite() && *x > 0.0)
        .collect();
    let lo = ratios
        .iter()
        .copied()
        .fold(0.5f64, f64::min)
        .log10()
        .floor();
    let hi = ratios.iter().copied().fold(2.0f64, f64::max).log10().ceil();
    let y = |v: f64| top + panel_h * (hi - v.log10()) / (hi - lo);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        o,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{left}" y="20" font-size="14" font-weight="bold">{}</text>"#,
        xml(&format!(
            "gpupool throughput ÷ baseline ({}; {} UTC, {})",
            a.backend, a.date, a.commit
        ))
    );
    let _ = writeln!(
        o,
        r#"<text x="{left}" y="36">{}</text>"#,
        xml("log scale; above 1× gpupool is faster. Median of the repeats of one run.")
    );
    for (i, name) in POOL_BASELINES.iter().enumerate() {
        let x = left + 10.0 + 150.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<rect x="{x}" y="44" width="12" height="12" fill="{}"/><text x="{}" y="54">{}</text>"#,
            COLORS[i],
            x + 16.0,
            xml(&format!("÷ {name}"))
        );
    }
    // Decade grid lines and labels.
    let mut e = lo;
    while e <= hi {
        let v = 10f64.powf(e);
        let yy = y(v);
        let _ = writeln!(
            o,
            r##"<line x1="{left}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}×</text>"##,
            width - 20.0,
            left - 4.0,
            yy + 4.0,
            if v >= 1.0 {
                format!("{v:.0}")
            } else {
                format!("{v}")
            }
        );
        e += 1.0;
    }
    let one = y(1.0);
    for (p, op) in ops.iter().enumerate() {
        let x0 = left + panel_w * p as f64;
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-weight="bold">{}</text>"#,
            x0 + panel_w / 2.0,
            top + panel_h + 40.0,
            xml(op)
        );
        let group_w = (panel_w - 20.0) / s.threads.len().max(1) as f64;
        let bar_w = (group_w - 8.0) / POOL_BASELINES.len() as f64;
        for (g, &threads) in s.threads.iter().enumerate() {
            let gx = x0 + 10.0 + group_w * g as f64;
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{threads} t</text>"#,
                gx + group_w / 2.0,
                top + panel_h + 16.0
            );
            for (b, base) in POOL_BASELINES.iter().enumerate() {
                let Some(v) = tput_ratio(r, op, base, threads) else {
                    continue;
                };
                let yy = y(v.max(10f64.powf(lo)));
                let (y1, h) = if yy < one {
                    (yy, one - yy)
                } else {
                    (one, yy - one)
                };
                let bx = gx + 4.0 + bar_w * b as f64;
                let _ = writeln!(
                    o,
                    r#"<rect x="{bx:.1}" y="{y1:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}</title></rect>"#,
                    bar_w - 1.0,
                    h.max(0.5),
                    COLORS[b],
                    xml(&format!(
                        "{op}, {threads} threads: gpupool ÷ {base} = {v:.3}"
                    ))
                );
            }
        }
        let _ = writeln!(
            o,
            r#"<line x1="{x0:.1}" x2="{:.1}" y1="{one:.1}" y2="{one:.1}" stroke="black"/>"#,
            x0 + panel_w
        );
    }
    o.push_str("</svg>\n");
    o
}
