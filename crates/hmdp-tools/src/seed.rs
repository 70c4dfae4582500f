//! `hmdp seed`: sample shop categories and shops, each with a seckill
//! voucher on sale, so that hmdp's front end can be walked from the home
//! page to a purchase. The shops are invented; the categories are hmdp's.
//!
//! Running it again leaves the same rows: categories and shops are written
//! under fixed ids (insert or overwrite), and a shop that already lists a
//! seckill voucher gets no second one.

use std::time::Duration;

use anyhow::Context;
use chrono::NaiveDate;
use clap::Args;

use hmdp::config::DatabaseSettings;
use hmdp::ids::ShopId;
use hmdp::store::{self, NewSeckillVoucher, NewVoucher, Shop, ShopType, Store};

/// `hmdp seed`.
#[derive(Debug, Clone, Args)]
pub struct SeedSettings {
    /// MySQL: the database is created and migrated if needed.
    #[command(flatten)]
    pub database: DatabaseSettings,
}

/// hmdp's categories: id, name, icon (under the front end's `/imgs`), sort.
const SHOP_TYPES: [(u64, &str, &str, u32); 10] = [
    (1, "美食", "/types/ms.png", 1),
    (2, "KTV", "/types/KTV.png", 2),
    (3, "丽人·美发", "/types/lrmf.png", 3),
    (4, "健身运动", "/types/jsyd.png", 10),
    (5, "按摩·足疗", "/types/amzl.png", 5),
    (6, "美容SPA", "/types/spa.png", 6),
    (7, "亲子游乐", "/types/qzyl.png", 7),
    (8, "酒吧", "/types/jiuba.png", 8),
    (9, "轰趴馆", "/types/hpg.png", 9),
    (10, "美睫·美甲", "/types/mjmj.png", 4),
];

/// One invented shop: category, name, area, address, average price (yuan),
/// sold, comments, score (stars × 10), opening hours. Its id is its place
/// in [`SHOPS`], from 1.
type ShopRow = (
    u64,
    &'static str,
    &'static str,
    &'static str,
    u64,
    u32,
    u32,
    u32,
    &'static str,
);

// One shop a line: a table to read and extend, not 32 blocks of 11 lines.
#[rustfmt::skip]
const SHOPS: [ShopRow; 32] = [
    (1, "拾味小馆", "运河上街", "台州路2号运河上街购物中心F3", 68, 4210, 1830, 46, "10:00-22:00"),
    (1, "老街口面馆", "大关", "大关路118号", 28, 9120, 3504, 45, "06:30-20:30"),
    (1, "青禾素食餐厅", "拱宸桥/上塘", "上塘路520号二楼", 88, 1530, 620, 47, "11:00-21:00"),
    (1, "渔火炉鱼(北部新城店)", "北部新城", "杭行路88号汇金广场1层", 95, 3302, 1411, 44, "11:00-23:00"),
    (1, "月光寿司", "远洋乐堤港", "丽水路58号远洋乐堤港B1", 128, 2230, 990, 48, "11:30-21:30"),
    (1, "串串时光", "大关", "东新路366号", 75, 6610, 2875, 43, "16:00-02:00"),
    (1, "阿婆糖水铺", "运河上街", "金华路80号运河上街B1", 22, 11040, 4022, 47, "10:00-23:00"),
    (1, "山海烧肉", "拱宸桥/上塘", "湖州街199号", 138, 1876, 842, 46, "11:00-22:30"),
    (2, "声浪KTV(运河店)", "运河上街", "台州路2号运河上街购物中心F4", 70, 20310, 1202, 44, "12:00-02:00"),
    (2, "麦霸量贩KTV", "水晶城", "上塘路458号水晶城购物中心6层", 65, 17450, 905, 42, "13:00-06:00"),
    (2, "星光唱吧", "北部新城", "杭行路666号万达广场C座3F", 58, 9980, 512, 45, "10:00-24:00"),
    (2, "回声Mini KTV", "远洋乐堤港", "丽水路66号远洋乐堤港F4", 40, 6220, 330, 41, "10:00-02:00"),
    (3, "剪艺造型", "大关", "大关路300号", 98, 3120, 640, 47, "10:00-21:00"),
    (3, "发现美发沙龙", "拱宸桥/上塘", "上塘路1100号", 158, 1450, 388, 46, "10:00-22:00"),
    (3, "小林烫染工作室", "运河上街", "金华路66号", 128, 980, 205, 48, "11:00-20:00"),
    (4, "燃力健身(运河店)", "运河上街", "台州路2号运河上街购物中心F2", 60, 5210, 730, 45, "06:00-23:00"),
    (4, "云上瑜伽", "远洋乐堤港", "丽水路58号远洋乐堤港F5", 88, 2130, 415, 47, "08:00-22:00"),
    (4, "跃动攀岩馆", "北部新城", "杭行路300号", 120, 1320, 260, 48, "10:00-22:00"),
    (5, "舒心足道", "大关", "东新路210号", 128, 7420, 1510, 45, "12:00-02:00"),
    (5, "松间推拿", "拱宸桥/上塘", "上塘路600号", 98, 3410, 702, 46, "10:00-24:00"),
    (6, "悦颜SPA", "水晶城", "上塘路458号水晶城购物中心5层", 268, 1120, 310, 47, "10:00-22:00"),
    (6, "花间美容会所", "远洋乐堤港", "丽水路66号远洋乐堤港F3", 198, 860, 201, 46, "10:00-21:00"),
    (7, "奇妙森林乐园", "北部新城", "杭行路666号万达广场4F", 99, 8820, 1904, 46, "09:30-21:30"),
    (7, "小小探险家", "运河上街", "台州路2号运河上街购物中心F5", 79, 4450, 980, 45, "10:00-21:00"),
    (8, "蓝调小酒馆", "大关", "大关路58号", 108, 2310, 611, 46, "19:00-03:00"),
    (8, "仓库精酿", "远洋乐堤港", "丽水路58号远洋乐堤港1层", 128, 3040, 790, 47, "17:00-02:00"),
    (8, "夜航酒吧", "运河上街", "金华路100号", 150, 1250, 330, 44, "20:00-04:00"),
    (9, "派对星球轰趴馆", "北部新城", "杭行路500号", 88, 1560, 402, 46, "00:00-24:00"),
    (9, "木屋轰趴", "拱宸桥/上塘", "湖州街300号", 75, 920, 240, 45, "10:00-次日10:00"),
    (10, "指尖艺术美甲", "运河上街", "金华路90号", 118, 2660, 720, 47, "10:00-21:30"),
    (10, "睫语美睫", "水晶城", "上塘路458号水晶城购物中心4层", 138, 1430, 388, 46, "10:00-21:00"),
    (10, "糖果美甲美睫", "大关", "东新路120号", 88, 3190, 860, 45, "10:00-22:00"),
];

/// Stock of each seeded seckill voucher.
const VOUCHER_STOCK: i32 = 100;

/// What a seed run left in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seeded {
    pub shop_types: usize,
    pub shops: usize,
    /// Seckill vouchers this run created.
    pub vouchers_created: usize,
    /// Shops that already listed a seckill voucher.
    pub vouchers_kept: usize,
}

/// `hmdp seed`: creates and migrates the database if needed, seeds it and
/// prints one line.
pub async fn run(settings: SeedSettings) -> anyhow::Result<()> {
    store::create_database_if_missing(&settings.database.url).await?;
    let store = Store::connect_lazy(&settings.database.url, 2, Duration::from_secs(10))?;
    store.migrate().await?;
    let seeded = seed(&store).await?;
    println!(
        "seeded {} shop types and {} shops, each with a seckill voucher ({} created, {} already there)",
        seeded.shop_types, seeded.shops, seeded.vouchers_created, seeded.vouchers_kept
    );
    Ok(())
}

/// Writes the categories, the shops and a seckill voucher for each shop
/// that lists none. The vouchers are created as `POST /voucher/seckill`
/// creates them; a node in `queue` or `stream` mode loads each sale into
/// Redis on its first purchase.
pub async fn seed(store: &Store) -> anyhow::Result<Seeded> {
    for (id, name, icon, sort) in SHOP_TYPES {
        store
            .save_shop_type(&ShopType {
                id,
                name: Some(name.into()),
                icon: Some(icon.into()),
                sort: Some(sort),
                create_time: None,
                update_time: None,
            })
            .await
            .with_context(|| format!("writing shop type {id}"))?;
    }
    let mut seeded = Seeded {
        shop_types: SHOP_TYPES.len(),
        shops: SHOPS.len(),
        vouchers_created: 0,
        vouchers_kept: 0,
    };
    for (index, row) in SHOPS.iter().enumerate() {
        let shop = shop(index as u64 + 1, row);
        store
            .save_shop(&shop)
            .await
            .with_context(|| format!("writing shop {}", shop.id))?;
        let listed = store.vouchers_of_shop(shop.id).await?;
        if listed.iter().any(|voucher| voucher.stock.is_some()) {
            seeded.vouchers_kept += 1;
            continue;
        }
        let (voucher, sale) = voucher(&shop);
        store
            .insert_seckill_voucher(&voucher, &sale)
            .await
            .with_context(|| format!("creating the seckill voucher of shop {}", shop.id))?;
        seeded.vouchers_created += 1;
    }
    Ok(seeded)
}

fn shop(id: u64, row: &ShopRow) -> Shop {
    let &(type_id, name, area, address, avg_price, sold, comments, score, open_hours) = row;
    Shop {
        id: ShopId::new(id),
        name: name.into(),
        type_id,
        // Placeholders in the front end's image folder: a page shows an
        // empty frame, never a broken layout.
        images: (1..=3)
            .map(|n| format!("/imgs/shops/{id}/{n}.jpg"))
            .collect::<Vec<_>>()
            .join(","),
        area: Some(area.into()),
        address: address.into(),
        // Spread over a few streets of hmdp's own neighbourhood.
        x: 120.12 + (id % 7) as f64 * 0.006,
        y: 30.30 + (id % 5) as f64 * 0.008,
        avg_price: Some(avg_price),
        sold,
        comments,
        score,
        open_hours: Some(open_hours.into()),
        create_time: None,
        update_time: None,
    }
}

/// A voucher worth about the shop's average price, sold at 80%, on sale
/// from 2025 to the end of 2037 (`TIMESTAMP` columns end in January 2038).
fn voucher(shop: &Shop) -> (NewVoucher, NewSeckillVoucher) {
    let yuan = shop.avg_price.unwrap_or(50).div_ceil(10) * 10;
    let voucher = NewVoucher {
        shop_id: shop.id.get(),
        title: format!("{yuan}元代金券"),
        sub_title: Some("周一至周日均可使用".into()),
        rules: Some("全场通用\\n无需预约\\n不兑现、不找零".into()),
        pay_value: yuan * 80,
        actual_value: (yuan * 100) as i64,
        voucher_type: 1,
        status: 1,
    };
    let at = |year, month, day, h, m, s| {
        NaiveDate::from_ymd_opt(year, month, day)
            .and_then(|date| date.and_hms_opt(h, m, s))
            .expect("a valid date")
    };
    let sale = NewSeckillVoucher {
        stock: VOUCHER_STOCK,
        begin_time: at(2025, 1, 1, 0, 0, 0),
        end_time: at(2037, 12, 31, 23, 59, 59),
        shards: 1,
    };
    (voucher, sale)
}
