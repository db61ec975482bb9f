//! Parsing of zoo specs: `family` or `family:key=value,key=value`. Values are
//! taken by typed getters; whatever is left over at the end is an unknown key.

use crate::error::FrontendError;

/// The largest size a spec may give to any one dimension. It keeps every
/// product of dimensions far from overflowing and catches typos (`hidden=7680000`).
pub(crate) const MAX_DIM: usize = 1 << 24;

/// A parsed spec: the family (or preset) name and its `key=value` overrides.
pub(crate) struct Spec<'a> {
    /// The whole spec, for error messages.
    pub text: &'a str,
    /// The part before `:`.
    pub family: &'a str,
    pairs: Vec<(&'a str, &'a str)>,
}

impl<'a> Spec<'a> {
    /// Splits `text` into a family and its `key=value` pairs.
    pub fn parse(text: &'a str) -> Result<Spec<'a>, FrontendError> {
        let text = text.trim();
        let (family, rest) = match text.split_once(':') {
            Some((f, r)) => (f.trim(), Some(r)),
            None => (text, None),
        };
        if family.is_empty() {
            return Err(FrontendError::bad_spec(
                text,
                "empty model name; try `gpt2` or `gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024`",
            ));
        }
        let mut pairs: Vec<(&str, &str)> = Vec::new();
        for item in rest.into_iter().flat_map(|r| r.split(',')) {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let Some((k, v)) = item.split_once('=') else {
                return Err(FrontendError::bad_spec(
                    text,
                    format!("`{item}` is not of the form key=value"),
                ));
            };
            let (k, v) = (k.trim(), v.trim());
            if pairs.iter().any(|(seen, _)| *seen == k) {
                return Err(FrontendError::bad_spec(
                    text,
                    format!("`{k}` is given twice"),
                ));
            }
            pairs.push((k, v));
        }
        Ok(Spec {
            text,
            family,
            pairs,
        })
    }

    /// A `BadSpec` error about this spec.
    pub fn error(&self, reason: impl Into<String>) -> FrontendError {
        FrontendError::bad_spec(self.text, reason)
    }

    fn take(&mut self, key: &str) -> Option<&'a str> {
        let i = self.pairs.iter().position(|(k, _)| *k == key)?;
        Some(self.pairs.remove(i).1)
    }

    /// A size `key=N` with `1 <= N <= MAX_DIM`, if given.
    pub fn size(&mut self, key: &str) -> Result<Option<usize>, FrontendError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        let n: usize = v.replace('_', "").parse().map_err(|_| {
            self.error(format!(
                "`{key}={v}`: {key} must be a whole number such as {key}=8"
            ))
        })?;
        if n == 0 || n > MAX_DIM {
            return Err(self.error(format!(
                "`{key}={v}`: {key} must be between 1 and {MAX_DIM}"
            )));
        }
        Ok(Some(n))
    }

    /// A probability `key=p` with `0 <= p < 1`, if given.
    pub fn probability(&mut self, key: &str) -> Result<Option<f64>, FrontendError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        match v.parse::<f64>() {
            Ok(p) if (0.0..1.0).contains(&p) => Ok(Some(p)),
            _ => Err(self.error(format!(
                "`{key}={v}`: {key} must be a number with 0 <= {key} < 1, such as {key}=0.1"
            ))),
        }
    }

    /// A finite number `key=x` with `x > 0` (`1e-6`, `500000`), if given.
    pub fn positive(&mut self, key: &str) -> Result<Option<f64>, FrontendError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        match v.replace('_', "").parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
            _ => Err(self.error(format!(
                "`{key}={v}`: {key} must be a positive number such as {key}=1e-5"
            ))),
        }
    }

    /// A flag `key=true|false` (also `1|0`, `yes|no`), if given.
    pub fn flag(&mut self, key: &str) -> Result<Option<bool>, FrontendError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        match v {
            "true" | "1" | "yes" => Ok(Some(true)),
            "false" | "0" | "no" => Ok(Some(false)),
            _ => Err(self.error(format!("`{key}={v}`: {key} must be true or false"))),
        }
    }

    /// One of `choices`, if given.
    pub fn choice(
        &mut self,
        key: &str,
        choices: &[&'static str],
    ) -> Result<Option<&'static str>, FrontendError> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        match choices.iter().find(|c| **c == v) {
            Some(c) => Ok(Some(c)),
            None => Err(self.error(format!(
                "`{key}={v}`: {key} must be one of {}",
                choices.join(", ")
            ))),
        }
    }

    /// Fails if any key was not taken by a getter.
    pub fn finish(&self, allowed: &[&str]) -> Result<(), FrontendError> {
        match self.pairs.first() {
            None => Ok(()),
            Some((k, _)) => Err(self.error(format!(
                "unknown key `{k}` for `{}`; allowed keys: {}",
                self.family,
                allowed.join(", ")
            ))),
        }
    }
}

/// `value` if present, else `base`, else a "missing key" error.
pub(crate) fn required<T>(
    spec: &Spec<'_>,
    key: &str,
    value: Option<T>,
    base: Option<T>,
    needed: &str,
) -> Result<T, FrontendError> {
    value.or(base).ok_or_else(|| {
        spec.error(format!(
            "missing `{key}=`; `{}` needs {needed}",
            spec.family
        ))
    })
}
