//! A drawing as a list of primitives in pixel coordinates (origin top left), which both the SVG
//! writer and the PNG rasteriser render, so the two files always show the same picture.

/// An sRGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rgb(pub u8, pub u8, pub u8);

impl Rgb {
    pub const BLACK: Rgb = Rgb(0, 0, 0);
    pub const WHITE: Rgb = Rgb(255, 255, 255);

    pub fn hex(self) -> String {
        format!("#{:02x}{:02x}{:02x}", self.0, self.1, self.2)
    }
}

/// Text sizes, as the heights of the embedded font's pre-rendered rasters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextSize {
    Small,
    Normal,
    Title,
}

impl TextSize {
    /// Line height in pixels.
    pub fn height(self) -> f64 {
        match self {
            TextSize::Small => 16.0,
            TextSize::Normal => 20.0,
            TextSize::Title => 24.0,
        }
    }

    /// Advance of one character: the embedded monospace font's width for this height (about
    /// 0.45 of it), so layout in the SVG and in the PNG agrees.
    pub fn char_width(self) -> f64 {
        super::raster::char_width(self) as f64
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Debug, Clone)]
pub enum Shape {
    /// A polyline; `dash` = (on, off) lengths in pixels.
    Line {
        points: Vec<(f64, f64)>,
        color: Rgb,
        width: f64,
        dash: Option<(f64, f64)>,
    },
    /// A filled disc, with a tooltip in the SVG (the data value it marks).
    Dot {
        center: (f64, f64),
        radius: f64,
        color: Rgb,
        tip: Option<String>,
    },
    /// An axis-aligned rectangle.
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
        fill: Option<Rgb>,
        stroke: Option<Rgb>,
    },
    /// One line of text, vertically centred on `at.1` (or, when `vertical`, rotated a quarter
    /// turn counter-clockwise and centred on `at.0`).
    Text {
        at: (f64, f64),
        text: String,
        size: TextSize,
        anchor: Anchor,
        color: Rgb,
        vertical: bool,
    },
}

#[derive(Debug, Clone)]
pub struct Scene {
    pub width: u32,
    pub height: u32,
    pub shapes: Vec<Shape>,
}

impl Scene {
    pub fn new(width: u32, height: u32) -> Scene {
        Scene {
            width,
            height,
            shapes: Vec::new(),
        }
    }

    pub fn line(&mut self, points: Vec<(f64, f64)>, color: Rgb, width: f64) {
        self.shapes.push(Shape::Line {
            points,
            color,
            width,
            dash: None,
        });
    }

    pub fn dashed(&mut self, points: Vec<(f64, f64)>, color: Rgb, width: f64, dash: (f64, f64)) {
        self.shapes.push(Shape::Line {
            points,
            color,
            width,
            dash: Some(dash),
        });
    }

    pub fn text(
        &mut self,
        at: (f64, f64),
        text: impl Into<String>,
        size: TextSize,
        anchor: Anchor,
    ) {
        self.shapes.push(Shape::Text {
            at,
            text: text.into(),
            size,
            anchor,
            color: Rgb::BLACK,
            vertical: false,
        });
    }
}
