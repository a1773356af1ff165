//! The report's window (docs/contract.md#41-window-and-formats).

use time::Date;

/// The largest accepted number of days of a [`Window`].
pub const MAX_DAYS: u32 = 365;

/// Why a [`Window`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WindowError {
    /// `days` is not in `1..=365`. Holds the refused value.
    #[error("days must be between 1 and 365, got {0}")]
    DaysOutOfRange(u32),
    /// The period, or the previous period, would start before the earliest date `time`
    /// represents.
    #[error("the period starts before the earliest representable date")]
    DateOutOfRange,
}

/// The report's window (docs/contract.md#41-window-and-formats): the `days` UTC days ending `today`.
///
/// The period is `[start, today]` (that is `[today − (days − 1), tomorrow)`), the previous
/// period is the `days` days before it, `[previous_start, start)`. All days are UTC calendar
/// days; a task belongs to the day of its `createdAt` in UTC ([`TaskFact::day`]).
///
/// [`TaskFact::day`]: crate::TaskFact::day
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    today: Date,
    days: u32,
}

impl Window {
    /// A window of `days` days ending `today`.
    ///
    /// Refuses `days` outside `1..=365` ([`WindowError::DaysOutOfRange`]) and a `today` so
    /// early that the previous period would start before the earliest representable date
    /// ([`WindowError::DateOutOfRange`]).
    pub fn new(today: Date, days: u32) -> Result<Window, WindowError> {
        if !(1..=MAX_DAYS).contains(&days) {
            return Err(WindowError::DaysOutOfRange(days));
        }
        // Both period starts must be representable; checked once here so that the
        // accessors below never fail.
        let back = i32::try_from(2 * days - 1).map_err(|_| WindowError::DateOutOfRange)?;
        Date::from_julian_day(today.to_julian_day() - back)
            .map_err(|_| WindowError::DateOutOfRange)?;
        Ok(Window { today, days })
    }

    /// The last day of the period (today, in UTC).
    pub fn today(&self) -> Date {
        self.today
    }

    /// The number of days of the period, `1..=365`.
    pub fn days(&self) -> u32 {
        self.days
    }

    /// The first day of the period: `today − (days − 1)`.
    pub fn start(&self) -> Date {
        self.days_before_today(self.days - 1)
    }

    /// The first day of the previous period: `start − days`. The previous period is
    /// `[previous_start, start)`.
    pub fn previous_start(&self) -> Date {
        self.days_before_today(2 * self.days - 1)
    }

    /// The first day of today's month.
    pub fn month_start(&self) -> Date {
        self.today.replace_day(1).unwrap_or(self.today)
    }

    /// The days of today's month after today: 0 on the month's last day.
    pub fn days_remaining_in_month(&self) -> u32 {
        let length = self.today.month().length(self.today.year());
        u32::from(length.saturating_sub(self.today.day()))
    }

    /// Whether `day` is in the period: `start <= day <= today`.
    pub fn contains(&self, day: Date) -> bool {
        self.start() <= day && day <= self.today
    }

    /// Whether `day` is in the previous period: `previous_start <= day < start`.
    pub fn in_previous(&self, day: Date) -> bool {
        self.previous_start() <= day && day < self.start()
    }

    /// Whether `day` is in today's month up to today: `month_start <= day <= today`.
    pub fn in_month_to_date(&self, day: Date) -> bool {
        self.month_start() <= day && day <= self.today
    }

    /// The days of the period, oldest first (exactly `days` of them).
    pub fn period_days(&self) -> impl Iterator<Item = Date> + use<> {
        let first = self.start().to_julian_day();
        let last = self.today.to_julian_day();
        (first..=last).filter_map(|julian| Date::from_julian_day(julian).ok())
    }

    /// `today − back` days; `back ≤ 2 × days − 1`, validated by [`Window::new`].
    fn days_before_today(&self, back: u32) -> Date {
        i32::try_from(back)
            .ok()
            .and_then(|back| Date::from_julian_day(self.today.to_julian_day() - back).ok())
            .unwrap_or(Date::MIN)
    }
}

#[cfg(test)]
mod tests {
    use time::macros::date;

    use super::*;

    #[test]
    fn days_must_be_in_range() {
        let today = date!(2024 - 05 - 10);
        assert_eq!(Window::new(today, 0), Err(WindowError::DaysOutOfRange(0)));
        assert_eq!(
            Window::new(today, 366),
            Err(WindowError::DaysOutOfRange(366))
        );
        assert!(Window::new(today, 1).is_ok());
        assert!(Window::new(today, 365).is_ok());
        assert_eq!(Window::new(Date::MIN, 1), Err(WindowError::DateOutOfRange));
        assert_eq!(
            WindowError::DaysOutOfRange(0).to_string(),
            "days must be between 1 and 365, got 0"
        );
    }

    #[test]
    fn bounds() {
        let w = Window::new(date!(2024 - 03 - 01), 30).unwrap();
        assert_eq!(w.today(), date!(2024 - 03 - 01));
        assert_eq!(w.days(), 30);
        // 2024 is a leap year: March 1st minus 29 days is February 1st.
        assert_eq!(w.start(), date!(2024 - 02 - 01));
        assert_eq!(w.previous_start(), date!(2024 - 01 - 02));
        assert_eq!(w.month_start(), date!(2024 - 03 - 01));
        assert_eq!(w.days_remaining_in_month(), 30);
        assert!(w.contains(date!(2024 - 02 - 01)));
        assert!(w.contains(date!(2024 - 03 - 01)));
        assert!(!w.contains(date!(2024 - 03 - 02)));
        assert!(!w.contains(date!(2024 - 01 - 31)));
        assert!(w.in_previous(date!(2024 - 01 - 31)));
        assert!(w.in_previous(date!(2024 - 01 - 02)));
        assert!(!w.in_previous(date!(2024 - 01 - 01)));
        assert!(!w.in_previous(date!(2024 - 02 - 01)));
        assert!(w.in_month_to_date(date!(2024 - 03 - 01)));
        assert!(!w.in_month_to_date(date!(2024 - 02 - 29)));
        assert_eq!(w.period_days().count(), 30);
        assert_eq!(w.period_days().next(), Some(date!(2024 - 02 - 01)));
        assert_eq!(w.period_days().last(), Some(date!(2024 - 03 - 01)));
    }

    #[test]
    fn one_day() {
        let w = Window::new(date!(2024 - 12 - 31), 1).unwrap();
        assert_eq!(w.start(), date!(2024 - 12 - 31));
        assert_eq!(w.previous_start(), date!(2024 - 12 - 30));
        assert_eq!(w.days_remaining_in_month(), 0);
        assert_eq!(w.month_start(), date!(2024 - 12 - 01));
        assert_eq!(w.period_days().collect::<Vec<_>>(), [date!(2024 - 12 - 31)]);
    }

    #[test]
    fn month_ends() {
        let remaining = |d: Date| Window::new(d, 7).unwrap().days_remaining_in_month();
        assert_eq!(remaining(date!(2024 - 02 - 28)), 1);
        assert_eq!(remaining(date!(2024 - 02 - 29)), 0);
        assert_eq!(remaining(date!(2023 - 02 - 28)), 0);
        assert_eq!(remaining(date!(2024 - 01 - 01)), 30);
        assert_eq!(remaining(date!(2024 - 12 - 31)), 0);
        assert_eq!(remaining(date!(2024 - 04 - 30)), 0);
        assert_eq!(remaining(date!(2024 - 04 - 01)), 29);
    }

    #[test]
    fn a_year() {
        let w = Window::new(date!(2024 - 12 - 31), 365).unwrap();
        assert_eq!(w.start(), date!(2024 - 01 - 02));
        assert_eq!(w.previous_start(), date!(2023 - 01 - 02));
        assert_eq!(w.period_days().count(), 365);
    }
}
